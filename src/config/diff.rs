//! What differs between two configs, key by key: a refused resume and a
//! refused rank name the keys and both values rather than two fingerprints.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A value longer than this is cut in a message: a config may hold long strings.
const MAX_VALUE_CHARS: usize = 80;
/// Keys named in one message; the rest are counted.
const MAX_KEYS: usize = 5;

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), v.to_string());
        }
    }
}

fn cut(s: &str) -> String {
    match s.char_indices().nth(MAX_VALUE_CHARS) {
        Some((at, _)) => format!("{}... ({} chars)", &s[..at], s.chars().count()),
        None => s.to_string(),
    }
}

/// Dotted keys whose values differ between configs `a` and `b` (as JSON), each
/// as "key: <a_label> X, <b_label> Y", in key order; "(unset)" where one lacks it.
pub fn diff_keys(a: &Value, b: &Value, (a_label, b_label): (&str, &str)) -> Vec<String> {
    let (mut fa, mut fb) = (BTreeMap::new(), BTreeMap::new());
    flatten("", a, &mut fa);
    flatten("", b, &mut fb);
    let keys: BTreeSet<&String> = fa.keys().chain(fb.keys()).collect();
    let none = "(unset)".to_string();
    keys.into_iter()
        .filter(|k| fa.get(*k) != fb.get(*k))
        .map(|k| {
            let (x, y) = (fa.get(k).unwrap_or(&none), fb.get(k).unwrap_or(&none));
            format!("{k}: {a_label} {}, {b_label} {}", cut(x), cut(y))
        })
        .collect()
}

/// [`diff_keys`] as one line: the first few joined by "; ", then "(and N more)";
/// `None` when nothing differs.
pub fn describe_diff(a: &Value, b: &Value, labels: (&str, &str)) -> Option<String> {
    let mut diff = diff_keys(a, b, labels);
    if diff.is_empty() {
        return None;
    }
    let more = diff.len().saturating_sub(MAX_KEYS);
    diff.truncate(MAX_KEYS);
    let more = if more > 0 { format!(" (and {more} more)") } else { String::new() };
    Some(format!("{}{more}", diff.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_each_differing_key_with_both_values() {
        let a = json!({"optimizer": {"lr": 0.05, "momentum": 0.9}, "run": {"seed": 1}});
        let b = json!({"optimizer": {"lr": 0.1, "momentum": 0.9}, "run": {"seed": 1, "extra": "x"}});
        assert_eq!(
            diff_keys(&a, &b, ("rank 0", "rank 1")),
            ["optimizer.lr: rank 0 0.05, rank 1 0.1", "run.extra: rank 0 (unset), rank 1 \"x\""]
        );
        assert_eq!(describe_diff(&a, &a, ("x", "y")), None);
    }

    #[test]
    fn long_values_are_cut_and_many_keys_counted() {
        let long = "z".repeat(10_000);
        let d = describe_diff(&json!({"k": long}), &json!({"k": 1}), ("a", "b")).unwrap();
        assert!(d.len() < 200 && d.contains("... (10002 chars), b 1"), "{d}");
        let a = json!({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1});
        let b = json!({"a": 2, "b": 2, "c": 2, "d": 2, "e": 2, "f": 2, "g": 2});
        let d = describe_diff(&a, &b, ("x", "y")).unwrap();
        assert!(d.starts_with("a: x 1, y 2; b: x 1, y 2") && d.ends_with("e: x 1, y 2 (and 2 more)"), "{d}");
    }
}
