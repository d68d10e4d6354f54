//! Emits the limits the spec states as constants (`OUT_DIR/limits.rs`), so that code checking a
//! request against them names the spec's number instead of repeating it.
//!
//! Every numeric bound of a component schema and of its properties (one level of `items` and
//! `additionalProperties` included), and of every operation's parameters, becomes a `pub const`:
//! `limits::exec_request::TIMEOUT_MS_MAXIMUM` is `ExecRequest.timeout_ms`'s `maximum`,
//! `limits::parameters::get_network_log::LIMIT_MAXIMUM` the `limit` parameter's of
//! `get_network_log`. Bounds of numbers are `f64`, of integers `u64` (or `i64` when negative
//! values are allowed), and of lengths and counts `usize`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use serde_json::{Map, Value};

use crate::spec::Spec;

/// The keywords that bound a value, and the suffix of their constants.
const BOUNDS: [(&str, &str); 8] = [
    ("minimum", "MINIMUM"),
    ("maximum", "MAXIMUM"),
    ("minLength", "MIN_LENGTH"),
    ("maxLength", "MAX_LENGTH"),
    ("minItems", "MIN_ITEMS"),
    ("maxItems", "MAX_ITEMS"),
    ("minProperties", "MIN_PROPERTIES"),
    ("maxProperties", "MAX_PROPERTIES"),
];

/// `ExecRequest` → `exec_request`.
pub(crate) fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The constants for one schema's own bounds, named `{prefix}{KEYWORD}`.
fn bounds(schema: &Value, prefix: &str, what: &str, out: &mut Vec<TokenStream>) {
    let Some(obj) = schema.as_object() else {
        return;
    };
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let unsigned = obj
        .get("minimum")
        .and_then(Value::as_f64)
        .is_some_and(|m| m >= 0.0);
    for (keyword, suffix) in BOUNDS {
        let Some(value) = obj.get(keyword) else {
            continue;
        };
        let name = format_ident!("{prefix}{suffix}");
        let doc = format!(" `{what}`: `{keyword}`.");
        let (ty, lit) = match (keyword, kind) {
            ("minimum" | "maximum", "number") => {
                let Some(v) = value.as_f64() else { continue };
                (quote!(f64), quote!(#v))
            }
            ("minimum" | "maximum", "integer") if unsigned => {
                let Some(v) = value.as_u64() else { continue };
                (quote!(u64), quote!(#v))
            }
            ("minimum" | "maximum", "integer") => {
                let Some(v) = value.as_i64() else { continue };
                (quote!(i64), quote!(#v))
            }
            ("minimum" | "maximum", _) => continue,
            _ => {
                let Some(v) = value.as_u64().and_then(|v| usize::try_from(v).ok()) else {
                    continue;
                };
                (quote!(usize), quote!(#v))
            }
        };
        out.push(quote! {
            #[doc = #doc]
            pub const #name: #ty = #lit;
        });
    }
}

/// A schema's bounds, its properties' and their items' and values'.
fn schema_bounds(name: &str, schema: &Value) -> Vec<TokenStream> {
    let mut out = Vec::new();
    bounds(schema, "", name, &mut out);
    let nested = |v: &Value, key: &str| v.get(key).filter(|s| s.is_object()).cloned();
    if let Some(values) = nested(schema, "additionalProperties") {
        bounds(&values, "VALUES_", &format!("{name}.*"), &mut out);
    }
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (field, prop) in &properties {
        let upper = field.to_ascii_uppercase();
        let what = format!("{name}.{field}");
        bounds(prop, &format!("{upper}_"), &what, &mut out);
        if let Some(items) = nested(prop, "items") {
            bounds(
                &items,
                &format!("{upper}_ITEMS_"),
                &format!("{what}[]"),
                &mut out,
            );
        }
        if let Some(values) = nested(prop, "additionalProperties") {
            bounds(
                &values,
                &format!("{upper}_VALUES_"),
                &format!("{what}.*"),
                &mut out,
            );
        }
    }
    out
}

fn module(name: &str, consts: Vec<TokenStream>) -> Option<TokenStream> {
    if consts.is_empty() {
        return None;
    }
    let ident = format_ident!("{}", snake(name));
    let doc = format!(" Limits of `{name}`.");
    Some(quote! {
        #[doc = #doc]
        pub mod #ident {
            #(#consts)*
        }
    })
}

pub fn generate(spec: &Spec) -> TokenStream {
    let components: &Map<String, Value> = spec.components();
    let schemas = components
        .iter()
        .filter_map(|(name, schema)| module(name, schema_bounds(name, schema)));
    let parameters = spec.operations.iter().filter_map(|op| {
        let mut consts = Vec::new();
        for arg in op.args.iter().filter(|a| a.schema_ref.is_none()) {
            if arg.location == crate::spec::Location::Body {
                continue;
            }
            let what = format!("{}({})", op.id, arg.name);
            bounds(
                &arg.schema,
                &format!("{}_", arg.name.to_ascii_uppercase()),
                &what,
                &mut consts,
            );
        }
        module(&op.id, consts)
    });
    quote! {
        #(#schemas)*

        /// Limits of operations' own parameters (those that are not a component).
        pub mod parameters {
            #(#parameters)*
        }
    }
}
