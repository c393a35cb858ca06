//! Lint output: text for people, JSON for scripts, SARIF 2.1.0 for code scanning.

use serde_json::{Value, json};

use super::rules::{Finding, RULES, Severity};
use crate::output::printable;

/// One line a finding, then a line a fix; waived findings say so, with their justification.
pub fn text(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let at = f.location.as_ref().map(|l| format!("{}:{}: ", l.file.display(), l.line)).unwrap_or_default();
        let waived = f.waived.as_ref().map(|j| format!(" (waived: {j})")).unwrap_or_default();
        // Queue names and messages come from brokers and files: nothing in them reaches the
        // terminal raw.
        let line = format!("{at}{} {} {}{waived}", f.severity.as_str(), f.rule, f.message);
        out.push_str(&format!("{}\n    fix: {}\n", printable(&line), printable(f.fix)));
    }
    let active: Vec<&Finding> = findings.iter().filter(|f| f.waived.is_none()).collect();
    let count = |s: Severity| active.iter().filter(|f| f.severity == s).count();
    out.push_str(&format!(
        "{} error(s), {} warning(s), {} note(s), {} waived\n",
        count(Severity::Error),
        count(Severity::Warning),
        count(Severity::Note),
        findings.len() - active.len()
    ));
    out
}

pub fn json(findings: &[Finding]) -> Value {
    json!({ "findings": findings, "rules": RULES })
}

/// SARIF 2.1.0, as GitHub code scanning takes it: rule metadata in the driver, one result a
/// finding with a physical location when it came from a file (a logical one, the queue,
/// otherwise), and waived findings as suppressed results.
pub fn sarif(findings: &[Finding]) -> Value {
    let rules: Vec<Value> = RULES
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "name": r.name,
                "shortDescription": { "text": r.summary },
                "fullDescription": { "text": r.why },
                "help": { "text": format!("{} Fix: {}", r.why, r.fix), "markdown": format!("{}\n\n**Fix:** {}", r.why, r.fix) },
                "defaultConfiguration": { "level": r.severity.as_str() },
                "helpUri": format!("https://github.com/dlqctl/dlqctl#{}", r.id.to_lowercase()),
            })
        })
        .collect();
    let results: Vec<Value> = findings
        .iter()
        .map(|f| {
            let rule_index = RULES.iter().position(|r| r.id == f.rule).unwrap_or(0);
            let mut location = json!({
                "logicalLocations": [{ "name": f.queue, "fullyQualifiedName": format!("{}/{}", f.broker, f.queue), "kind": "resource" }]
            });
            if let Some(l) = &f.location {
                location["physicalLocation"] = json!({
                    "artifactLocation": { "uri": l.file.display().to_string().trim_start_matches("./") },
                    "region": { "startLine": l.line.max(1) },
                });
            }
            let mut result = json!({
                "ruleId": f.rule,
                "ruleIndex": rule_index,
                "level": f.severity.as_str(),
                "message": { "text": format!("{} Fix: {}", f.message, f.fix) },
                "locations": [location],
            });
            if let Some(j) = &f.waived {
                result["suppressions"] = json!([{ "kind": "external", "justification": j }]);
            }
            result
        })
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "dlqctl",
                "version": env!("CARGO_PKG_VERSION"),
                "informationUri": "https://github.com/dlqctl/dlqctl",
                "rules": rules,
            }},
            "results": results,
        }],
    })
}
