//! `dlqctl lint`: gather the inventory from every input, run the rules, report, and exit 3
//! when a finding reaches `--fail-on`.

use super::Context;
use crate::broker;
use crate::cli::{LintArgs, LintFormat};
use crate::error::{Error, Result};
use crate::lint::{Inventory, offline, report, rules};

pub async fn run(ctx: &mut Context, args: &LintArgs) -> Result<()> {
    if args.brokers.is_empty() && args.templates.is_empty() {
        return Err(Error::Usage(
            "nothing to lint: give --broker TARGET or --template FILE (with --rules or --alerts for alerting kept \
             elsewhere)"
                .into(),
        ));
    }
    let mut inventory = Inventory::default();
    for b in &args.brokers {
        let target = ctx.config.resolve(b)?;
        let broker = broker::open(&target, &ctx.open_options()).await?;
        inventory.extend(broker.lint_inventory().await?);
    }
    for path in &args.templates {
        inventory.extend(offline::cloudformation(path)?);
    }
    for path in &args.rules {
        inventory.extend(offline::prometheus(path)?);
    }
    for path in &args.alerts {
        inventory.extend(offline::alert_file(path)?);
    }
    let findings = rules::check(&inventory, &ctx.config.lint)?;
    let format = if ctx.out.is_json() && args.format == LintFormat::Text { LintFormat::Json } else { args.format };
    match format {
        LintFormat::Text => std::io::Write::write_all(ctx.out.writer(), report::text(&findings).as_bytes())?,
        LintFormat::Json => ctx.out.json_line(&report::json(&findings))?,
        LintFormat::Sarif => ctx.out.json_line(&report::sarif(&findings))?,
    }
    let failing = findings.iter().filter(|f| f.waived.is_none() && f.severity >= args.fail_on).count();
    if failing > 0 {
        return Err(Error::Finished {
            code: 3,
            message: format!(
                "{failing} finding(s) at or above {} (see above; waive with a justification in [lint])",
                args.fail_on.as_str()
            ),
        });
    }
    Ok(())
}
