//! Target addresses: parsing never panics, and masking never lets a password through.
#![no_main]
use dlqctl::target::{Target, mask_input};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &str| {
    let _ = Target::parse(input);
    let masked = mask_input(input);
    // A scheme is a word; for anything else "://" is not where a URL starts.
    if let Some((scheme, rest)) = input.split_once("://")
        && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        && let Some((userinfo, _)) = rest.split_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
        && password.len() >= 4
        && password != "****"
        && !password.contains(['/', '?', '#', '@'])
    {
        assert!(!masked.contains(&format!(":{password}@")), "{masked:?} shows the password of {input:?}");
    }
});
