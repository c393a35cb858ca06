//! `dlqctl list`: the DLQs a target can see, with depth, age and sources.

use comfy_table::Color;
use serde_json::json;

use super::{Context, format_age};
use crate::broker;
use crate::cli::ListArgs;
use crate::error::Result;

pub async fn run(ctx: &mut Context, args: &ListArgs) -> Result<()> {
    let target = ctx.config.resolve(&args.target)?;
    let broker = broker::open(&target, &ctx.open_options()).await?;
    let dlqs = broker.list().await?;
    if ctx.out.is_json() {
        return ctx.out.json_line(&json!({ "target": target.to_string(), "dlqs": dlqs }));
    }
    let mut table = ctx.out.table(&["name", "kind", "depth", "oldest", "retention", "sources", "notes"]);
    for d in &dlqs {
        let depth = d.depth.map_or("?".into(), |n| n.to_string());
        let depth_color = if d.depth.unwrap_or(0) > 0 { Color::Yellow } else { Color::Green };
        table.add_row(vec![
            d.name.clone().into(),
            d.kind.into(),
            ctx.out.colored(depth, depth_color),
            d.oldest_age.map_or("-".into(), format_age).into(),
            d.retention.map_or("-".into(), format_age).into(),
            d.sources.join(",").into(),
            ctx.out.colored(d.notes.join("; "), Color::Red),
        ]);
    }
    ctx.out.print_table(&mut table)
}
