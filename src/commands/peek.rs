//! `dlqctl peek`: look at dead letters without consuming them, and say what looking costs.

use std::io::Write;

use chrono::Utc;
use comfy_table::Color;
use futures::TryStreamExt;

use super::{Context, format_age};
use crate::cli::PeekArgs;
use crate::error::Result;
use crate::model::{DeadLetter, ReasonKind, format_time};
use crate::output::{printable, printable_cut, printable_lines};

const PREVIEW_CHARS: usize = 60;

pub async fn run(ctx: &mut Context, args: &PeekArgs) -> Result<()> {
    let (target, broker) = ctx.open(&args.read).await?;
    let redactor = ctx.redactor(&args.redact);
    let mut letters = ctx.letters(broker.as_ref(), &args.read, Some(args.limit)).await?;
    let mut table =
        (!ctx.out.is_json() && !args.full).then(|| ctx.out.table(&["id", "age", "reason", "source", "body"]));
    let mut shown = 0u64;
    while let Some(mut letter) = letters.try_next().await? {
        redactor.apply(&mut letter);
        shown += 1;
        if ctx.out.is_json() {
            ctx.out.letter_line(&letter.view())?;
        } else if let Some(table) = &mut table {
            table.add_row(vec![
                letter.id.clone().into(),
                age(&letter).into(),
                ctx.out.colored(reason(&letter), reason_color(letter.reason.kind)),
                letter.source.name.clone().unwrap_or_else(|| "-".into()).into(),
                preview(letter.body.as_deref()).into(),
            ]);
        } else {
            write_full(ctx.out.writer(), &letter, shown > 1)?;
        }
    }
    drop(letters);
    broker.end_read().await?;
    if let Some(table) = &mut table
        && shown > 0
    {
        ctx.out.print_table(table)?;
    }
    if shown == 0 {
        ctx.out.note(&format!("no dead letters in {target}"));
    }
    ctx.report_read_notes(broker.as_ref());
    Ok(())
}

fn age(letter: &DeadLetter) -> String {
    letter.failed_at().map_or("-".into(), |t| format_age((Utc::now() - t).to_std().unwrap_or_default()))
}

fn reason(letter: &DeadLetter) -> String {
    let r = &letter.reason;
    match r.failure_class() {
        // The class's simple name fits a column; --full shows the whole of it.
        Some(class) => format!("{} ({})", r.kind, class.rsplit(['.', '$']).next().unwrap_or(class)),
        None => r.kind.to_string(),
    }
}

fn reason_color(kind: ReasonKind) -> Color {
    match kind {
        ReasonKind::Exception | ReasonKind::ErrorCode | ReasonKind::Rejected => Color::Red,
        ReasonKind::Expired | ReasonKind::Maxlen => Color::Yellow,
        ReasonKind::DeliveryLimit | ReasonKind::MaxReceiveCount => Color::Magenta,
        ReasonKind::Unknown => Color::Grey,
    }
}

/// One line of the body: text with control characters escaped, or what kind of body it is.
fn preview(body: Option<&[u8]>) -> String {
    let Some(body) = body else {
        return "<null>".into();
    };
    if body.is_empty() {
        return "<empty>".into();
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return format!("<binary, {} bytes>", body.len());
    };
    printable_cut(text, PREVIEW_CHARS)
}

fn write_full(w: &mut impl Write, letter: &DeadLetter, separator: bool) -> std::io::Result<()> {
    if separator {
        writeln!(w, "---")?;
    }
    // Every value is a stranger's text: shown whole, but with no control character raw.
    let field = |w: &mut dyn Write, name: &str, value: Option<String>| match value {
        Some(v) => writeln!(w, "{name:<14}{}", printable_lines(&v)),
        None => Ok(()),
    };
    field(w, "id:", Some(letter.id.clone()))?;
    field(w, "broker:", letter.broker.map(|b| b.as_str().to_owned()))?;
    field(w, "dlq:", letter.dlq.clone())?;
    let s = &letter.source;
    let mut source = s.name.clone().unwrap_or_else(|| "-".into());
    for (k, v) in [("address", s.address.clone()), ("exchange", s.exchange.clone())] {
        if let Some(v) = v {
            source.push_str(&format!(" {k}={v}"));
        }
    }
    if !s.routing_keys.is_empty() {
        source.push_str(&format!(" routing_keys={}", s.routing_keys.join(",")));
    }
    if let (Some(p), o) = (s.partition, s.offset) {
        source.push_str(&format!(" partition={p}"));
        if let Some(o) = o {
            source.push_str(&format!(" offset={o}"));
        }
    }
    field(w, "source:", Some(source))?;
    let r = &letter.reason;
    field(w, "reason:", Some(r.kind.to_string()))?;
    field(w, "  raw:", r.raw.clone())?;
    field(w, "  code:", r.code.clone())?;
    field(w, "  exception:", r.exception_class.clone())?;
    field(w, "  cause:", r.cause_class.clone())?;
    field(w, "  message:", r.message.clone())?;
    field(w, "failures:", letter.failure_count.map(|n| n.to_string()))?;
    field(w, "first failed:", letter.first_failed_at.as_ref().map(format_time))?;
    field(w, "last failed:", letter.last_failed_at.as_ref().map(format_time))?;
    field(w, "enqueued:", letter.enqueued_at.as_ref().map(format_time))?;
    for (title, headers) in [("headers:", &letter.headers), ("extras:", &letter.extras)] {
        if !headers.is_empty() {
            writeln!(w, "{title}")?;
            for (k, v) in headers.iter() {
                writeln!(w, "  {}: {}", printable(k), printable(&v.to_string()))?;
            }
        }
    }
    match letter.body.as_deref() {
        None => writeln!(w, "body:         <null>"),
        Some(b) => match std::str::from_utf8(b) {
            Ok(text) => writeln!(w, "body ({} bytes):\n{}", b.len(), printable_lines(text)),
            Err(_) => writeln!(w, "body (binary, {} bytes, base64):\n{}", b.len(), base64_of(b)),
        },
    }
}

fn base64_of(bytes: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_are_one_line_and_say_what_is_not_text() {
        assert_eq!(preview(None), "<null>");
        assert_eq!(preview(Some(b"")), "<empty>");
        assert_eq!(preview(Some(&[0xff, 0xfe])), "<binary, 2 bytes>");
        assert_eq!(preview(Some(b"a\nb")), "a\\nb");
        let long = "x".repeat(100);
        assert_eq!(preview(Some(long.as_bytes())).chars().count(), PREVIEW_CHARS + 1);
    }
}
