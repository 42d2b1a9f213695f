//! Lean tool schemas: what `tools/list` sends, which every MCP session pays
//! for in its context before any work. schemars writes schemas for Rust
//! types; an LLM and a validating client need less of them:
//!
//! - no `$schema`, no `title`, no `"default": null`;
//! - no non-standard `format` (`uint64`, `int32`, `double`: clients warn on
//!   them); an unsigned integer says `"minimum": 0` instead;
//! - an optional field is its type, not `[type, "null"]` (absent is how a
//!   client leaves it out; `null` is still accepted);
//! - a unit enum is `{"type": "string", "enum": [...]}`, not a `oneOf` of
//!   described constants (the field's own description says what matters);
//! - `$defs` are inlined where they are used, so nothing is defined twice
//!   or looked up;
//! - no `"additionalProperties": false` at the root: an unknown argument
//!   is refused with an error that names it.
//!
//! No output schemas are sent: a result's structured content is described
//! by the tool's description, and a client that has an output schema must
//! validate every result against it, which the text rendering beside the
//! structured content makes unnecessary.

use rmcp::handler::server::router::tool::ToolRouter;
use serde_json::{Map, Value};
use std::sync::Arc;

/// Rewrite every tool of `router` lean (see the module's doc).
pub(crate) fn lean_router<S>(router: &mut ToolRouter<S>) {
    for route in router.map.values_mut() {
        let schema = Value::Object(route.attr.input_schema.as_ref().clone());
        if let Value::Object(obj) = lean(schema) {
            route.attr.input_schema = Arc::new(obj);
        }
        route.attr.output_schema = None;
    }
}

/// The lean form of one schema.
pub(crate) fn lean(schema: Value) -> Value {
    let defs = match &schema {
        Value::Object(o) => o.get("$defs").and_then(Value::as_object).cloned().unwrap_or_default(),
        _ => Map::new(),
    };
    let mut lean = strip(schema, &defs, 0);
    if let Value::Object(root) = &mut lean {
        // The server refuses an unknown argument with an error naming it
        // and the ones it knows; the schema needn't say so on every tool.
        if root.get("additionalProperties") == Some(&Value::Bool(false)) {
            root.remove("additionalProperties");
        }
    }
    lean
}

/// How deep `$ref`s are followed: the schemas here nest a few levels; a
/// recursive type would otherwise inline forever.
const MAX_DEPTH: usize = 16;

fn strip(v: Value, defs: &Map<String, Value>, depth: usize) -> Value {
    let Value::Object(mut o) = v else {
        return match v {
            Value::Array(items) => Value::Array(items.into_iter().map(|i| strip(i, defs, depth)).collect()),
            other => other,
        };
    };
    o.remove("$schema");
    o.remove("$defs");
    o.remove("title");
    let empty = |d: &Value| d.is_null() || d.as_array().is_some_and(Vec::is_empty) || d.as_str() == Some("");
    if o.get("default").is_some_and(empty) {
        o.remove("default");
    }
    // An item's description is its type's, never more than the list's own.
    if let Some(Value::Object(items)) = o.get_mut("items") {
        items.remove("description");
    }
    if let Some(Value::String(f)) = o.remove("format") {
        if f.starts_with("uint") && !o.contains_key("minimum") {
            o.insert("minimum".into(), Value::from(0));
        }
    }
    // [T, "null"] → T.
    if let Some(Value::Array(types)) = o.get("type") {
        let non_null: Vec<Value> = types.iter().filter(|t| t.as_str() != Some("null")).cloned().collect();
        if non_null.len() == 1 {
            o.insert("type".into(), non_null[0].clone());
        }
    }
    // anyOf [X, {"type": "null"}] → X.
    if let Some(Value::Array(any)) = o.get("anyOf") {
        let non_null: Vec<Value> =
            any.iter().filter(|s| s.get("type").and_then(Value::as_str) != Some("null")).cloned().collect();
        if non_null.len() == 1 {
            o.remove("anyOf");
            merge_under(&mut o, non_null[0].clone());
        }
    }
    // {"$ref": "#/$defs/X", …} → X's body, under the keys already here.
    if let Some(Value::String(r)) = o.get("$ref").cloned() {
        if let Some(body) = r.strip_prefix("#/$defs/").and_then(|name| defs.get(name)) {
            if depth < MAX_DEPTH {
                o.remove("$ref");
                merge_under(&mut o, strip(body.clone(), defs, depth + 1));
            }
        }
    }
    // oneOf of described constants → enum.
    if let Some(Value::Array(alts)) = o.get("oneOf") {
        let consts: Option<Vec<Value>> = alts.iter().map(|a| a.get("const").cloned()).collect();
        if let Some(consts) = consts.filter(|c| c.iter().all(Value::is_string)) {
            o.remove("oneOf");
            o.insert("type".into(), Value::from("string"));
            o.insert("enum".into(), Value::Array(consts));
        }
    }
    Value::Object(
        o.into_iter()
            .map(|(k, v)| match (k.as_str(), v) {
                // A map of names to schemas: a property may be called
                // `title` or `format`; only its schema is stripped.
                ("properties", Value::Object(props)) => {
                    (k, Value::Object(props.into_iter().map(|(n, s)| (n, strip(s, defs, depth))).collect()))
                }
                (_, v) => (k, strip(v, defs, depth)),
            })
            .collect(),
    )
}

/// Add `from`'s keys to `into` where `into` has none: the referring
/// property's own description wins over the definition's.
fn merge_under(into: &mut Map<String, Value>, from: Value) {
    if let Value::Object(from) = from {
        for (k, v) in from {
            into.entry(k).or_insert(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_loses_what_a_client_does_not_need() {
        let s = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Req",
            "type": "object",
            "$defs": {"Mode": {"description": "How.", "oneOf": [
                {"const": "a", "description": "A.", "type": "string"},
                {"const": "b", "description": "B.", "type": "string"}]}},
            "properties": {
                "n": {"type": ["integer", "null"], "format": "uint64", "default": null, "description": "N."},
                "m": {"$ref": "#/$defs/Mode", "default": "a", "description": "The mode."},
                "x": {"anyOf": [{"$ref": "#/$defs/Mode"}, {"type": "null"}]},
                "f": {"type": "number", "format": "double"},
                "title": {"type": "string", "title": "T"}
            },
            "required": []
        });
        assert_eq!(
            lean(s),
            json!({
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "minimum": 0, "description": "N."},
                    "m": {"type": "string", "enum": ["a", "b"], "default": "a", "description": "The mode."},
                    "x": {"type": "string", "enum": ["a", "b"], "description": "How."},
                    "f": {"type": "number"},
                    "title": {"type": "string"}
                },
                "required": []
            })
        );
    }
}
