//! docs/script-api.md is the script API's reference: every function the script engine
//! registers has a `### name` entry there, and every entry names a registered function. (The
//! REPL's completion and `:help NAME` read the same file, compiled in.)

use rumus::script::{Host, HostOptions};
use std::collections::BTreeSet;

/// rhai's own functions the reference documents too (the host only routes their output).
const RHAI_OWN: &[&str] = &["print"];

/// Names of the functions registered by the host, getters and setters by their property name;
/// operators, indexers and the `to_string`/`to_debug` conversions are not API entries.
fn registered() -> BTreeSet<String> {
    let mut host = Host::new(HostOptions::default());
    let _ = host.eval(&rumus::Source::new("m.rms", "model m(x: f32[B, 1]) { return x }"));
    let models = ["m"];
    host.engine_mut()
        .gen_fn_signatures(false)
        .iter()
        .filter_map(|sig| {
            let name = sig.split('(').next()?.trim();
            let name = name.rsplit(' ').next()?;
            let name =
                name.strip_prefix("get$").or_else(|| name.strip_prefix("set$")).unwrap_or(name);
            let is_name = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            (is_name && !["to_string", "to_debug"].contains(&name) && !models.contains(&name))
                .then(|| name.to_string())
        })
        .collect()
}

fn documented() -> BTreeSet<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/script-api.md");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().filter_map(|l| l.strip_prefix("### ")).map(|n| n.trim().to_string()).collect()
}

#[test]
fn every_registered_function_has_an_entry_in_the_reference() {
    let registered = registered();
    for known in ["tensor", "evaluate", "lr", "progress", "x"] {
        assert!(registered.contains(known), "`{known}` not found among {registered:?}");
    }
    let documented = documented();
    let missing: Vec<_> = registered.difference(&documented).collect();
    assert!(missing.is_empty(), "registered but not in docs/script-api.md: {missing:?}");
    let stale: Vec<_> = documented
        .iter()
        .filter(|n| !registered.contains(*n) && !RHAI_OWN.contains(&n.as_str()))
        .collect();
    assert!(stale.is_empty(), "in docs/script-api.md but not registered: {stale:?}");
}
