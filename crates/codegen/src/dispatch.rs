//! Emits the dispatch from tool name to typed client call, as tokens for `OUT_DIR/dispatch.rs`.
//!
//! Each arm calls the progenitor builder for the tool's operation: path and query arguments
//! through their builder methods, body arguments gathered into the operation's generated body
//! type. A tool bound to an operation that vanished from the spec therefore fails to compile.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use serde_json::Value;

use crate::model::{ArgLocation, Registry, ToolDef};
use crate::spec::{Operation, Spec};

/// The `Args` accessor for a parameter of this schema (`u64`, `opt_u64`, …).
fn accessor(schema: &Value) -> &'static str {
    let kind = match schema.get("type") {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .find(|s| *s != "null")
            .unwrap_or(""),
        _ => "",
    };
    match kind {
        "integer"
            if schema
                .get("minimum")
                .and_then(Value::as_f64)
                .is_some_and(|m| m >= 0.0) =>
        {
            "u64"
        }
        "integer" => "i64",
        "number" => "f64",
        "boolean" => "bool",
        "string" if schema.get("format").and_then(Value::as_str) == Some("date-time") => "time",
        _ => "string",
    }
}

/// The statements that build the request for `op` from the tool's arguments, into `req`.
fn build_request(tool: &ToolDef, op: &Operation) -> TokenStream {
    let operation = format_ident!("{}", op.id);
    let mut setters = Vec::new();
    let mut body_fields = Vec::new();
    for arg in &tool.args {
        let Some(op_arg) = op.args.iter().find(|a| a.name == arg.name) else {
            continue;
        };
        let name = arg.name.as_str();
        match arg.location {
            ArgLocation::Body => body_fields.push(name),
            ArgLocation::Path | ArgLocation::Query => {
                let setter = format_ident!("{}", name);
                let kind = accessor(&op_arg.schema);
                setters.push(if op_arg.required {
                    let get = format_ident!("{}", kind);
                    quote! { req = req.#setter(args.#get(#name)?); }
                } else {
                    let get = format_ident!("opt_{}", kind);
                    quote! { if let Some(v) = args.#get(#name)? { req = req.#setter(v); } }
                });
            }
        }
    }
    let body = op.body_type.as_ref().map(|body| {
        let body = format_ident!("{}", body);
        quote! { req = req.body(args.body::<::sandbox_mcp_api::types::#body>(&[#(#body_fields),*])?); }
    });
    quote! {
        #[allow(unused_mut)]
        let mut req = client.#operation();
        #(#setters)*
        #body
    }
}

pub fn generate(spec: &Spec, registry: &Registry) -> TokenStream {
    let arms = registry.tools.iter().filter_map(|tool| {
        let op = spec.operation(&tool.operation)?;
        let name = tool.name.as_str();
        let request = build_request(tool, op);
        Some(quote! { #name => { #request respond(req.send().await) } })
    });
    let stream_arms = registry.tools.iter().filter_map(|tool| {
        let op = spec.operation(tool.stream_operation.as_ref()?)?;
        let name = tool.name.as_str();
        let request = build_request(tool, op);
        Some(quote! { #name => { #request respond_stream(req.send().await).map(Some) } })
    });
    quote! {
        /// Calls the operation bound to `tool` with validated arguments.
        pub async fn dispatch(
            client: &::sandbox_mcp_api::Client,
            tool: &str,
            args: &crate::args::Args,
        ) -> Result<serde_json::Value, crate::call::CallFailure> {
            use crate::call::respond;
            match tool {
                #(#arms)*
                _ => Err(crate::call::CallFailure::unknown_tool(tool)),
            }
        }

        /// Calls the streaming variant of `tool`'s operation; `None` when it has none.
        pub async fn dispatch_stream(
            client: &::sandbox_mcp_api::Client,
            tool: &str,
            args: &crate::args::Args,
        ) -> Result<Option<crate::call::EventStream>, crate::call::CallFailure> {
            #[allow(unused_imports)]
            use crate::call::respond_stream;
            match tool {
                #(#stream_arms)*
                _ => Ok(None),
            }
        }
    }
}
