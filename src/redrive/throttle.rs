//! `--rate`: a smooth pace (a token bucket holding a single token, so no bursts), or no
//! limit when the operator says `--rate unlimited` explicitly.

use std::num::NonZeroU32;
use std::str::FromStr;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    PerSecond(NonZeroU32),
    Unlimited,
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(s: &str) -> Result<Rate, String> {
        if s == "unlimited" {
            return Ok(Rate::Unlimited);
        }
        s.parse::<u32>()
            .ok()
            .and_then(NonZeroU32::new)
            .map(Rate::PerSecond)
            .ok_or_else(|| format!("{s:?} is not a rate: give messages per second (1 or more) or 'unlimited'"))
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rate::PerSecond(n) => write!(f, "{n}/s"),
            Rate::Unlimited => f.write_str("unlimited"),
        }
    }
}

pub struct Throttle {
    limiter: Option<DefaultDirectRateLimiter>,
}

impl Throttle {
    pub fn new(rate: Rate) -> Self {
        let limiter = match rate {
            Rate::PerSecond(n) => Some(RateLimiter::direct(Quota::per_second(n).allow_burst(NonZeroU32::MIN))),
            Rate::Unlimited => None,
        };
        Throttle { limiter }
    }

    /// Wait for the next message's turn.
    pub async fn acquire(&self) {
        if let Some(limiter) = &self.limiter {
            limiter.until_ready().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!("50".parse::<Rate>(), Ok(Rate::PerSecond(NonZeroU32::new(50).unwrap())));
        assert_eq!("unlimited".parse::<Rate>(), Ok(Rate::Unlimited));
        assert!("0".parse::<Rate>().is_err());
        assert!("fast".parse::<Rate>().unwrap_err().contains("unlimited"));
    }

    #[tokio::test]
    async fn the_pace_is_even() {
        let throttle = Throttle::new("200".parse().unwrap());
        let start = std::time::Instant::now();
        for _ in 0..21 {
            throttle.acquire().await;
        }
        // 20 intervals of 5 ms after the first token: no burst lets it finish early.
        assert!(start.elapsed() >= std::time::Duration::from_millis(95), "{:?}", start.elapsed());
    }
}
