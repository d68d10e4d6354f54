//! Emits the engine's side of the API (`OUT_DIR/server.rs`): the `EngineApi` trait, one async
//! method per operation of the spec on the generated types; a query struct per operation that
//! has query parameters; and the axum router that binds every operation's method and path to its
//! method, answering with the spec's success status.
//!
//! An implementation of the trait therefore fails to compile when an operation is added to the
//! spec (a missing method) or removed from it (a method the trait does not have), as the MCP
//! side's dispatch does. What the router extracts before it calls a method (the caller, a
//! checked sandbox id, the query, the body) is the API crate's hand-written `server` module.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use serde_json::Value;

use crate::spec::{Location, OpArg, Operation, Spec};

/// `get_network_log` → `GetNetworkLog`.
fn pascal(name: &str) -> String {
    name.split('_')
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The path parameter every sandbox operation has; the router checks it before calling.
const SANDBOX_ID: &str = "sandbox_id";

fn query_args(op: &Operation) -> Vec<&OpArg> {
    op.args
        .iter()
        .filter(|a| a.location == Location::Query)
        .collect()
}

/// Path parameters other than the sandbox id, in the order of the path.
fn path_args(op: &Operation) -> Vec<&OpArg> {
    op.args
        .iter()
        .filter(|a| a.location == Location::Path && a.name != SANDBOX_ID)
        .collect()
}

fn has_sandbox_id(op: &Operation) -> bool {
    op.args
        .iter()
        .any(|a| a.location == Location::Path && a.name == SANDBOX_ID)
}

fn query_type(op: &Operation) -> proc_macro2::Ident {
    format_ident!("{}Query", pascal(&op.id))
}

/// The Rust type of a query parameter: a generated enum where the spec names one (as a
/// component, or inline, which progenitor names `{Operation}{Parameter}`), else the plain
/// type of its schema (constraints on strings are the handler's to check, with its own words).
fn param_type(op: &Operation, arg: &OpArg) -> Result<TokenStream, String> {
    let schema = &arg.schema;
    if schema.get("enum").is_some() {
        let name = match &arg.schema_ref {
            Some(component) => format_ident!("{component}"),
            None => format_ident!("{}{}", pascal(&op.id), pascal(&arg.name)),
        };
        return Ok(quote!(crate::types::#name));
    }
    let kind = schema.get("type").and_then(Value::as_str).unwrap_or("");
    Ok(match kind {
        "string" if schema.get("format").and_then(Value::as_str) == Some("date-time") => {
            quote!(::chrono::DateTime<::chrono::Utc>)
        }
        "string" => quote!(::std::string::String),
        "boolean" => quote!(bool),
        "number" => quote!(f64),
        "integer"
            if schema
                .get("minimum")
                .and_then(Value::as_f64)
                .is_some_and(|m| m >= 0.0) =>
        {
            quote!(u64)
        }
        "integer" => quote!(i64),
        other => {
            return Err(format!(
                "operation `{}`: query parameter `{}` has type `{other}`, which the server cannot take",
                op.id, arg.name
            ));
        }
    })
}

/// The query struct of `op`: required parameters as they are, optional ones with a default as
/// that default (when it is the type's own: `false`, `0`), the others as `Option`s.
fn query_struct(op: &Operation) -> Result<Option<TokenStream>, String> {
    let args = query_args(op);
    if args.is_empty() {
        return Ok(None);
    }
    let mut fields = Vec::new();
    for arg in args {
        let name = format_ident!("{}", arg.name);
        let ty = param_type(op, arg)?;
        let doc = arg
            .schema
            .get("description")
            .and_then(Value::as_str)
            .map(|d| format!(" {d}"))
            .unwrap_or_default();
        let default = arg.schema.get("default");
        fields.push(if arg.required {
            quote! { #[doc = #doc] pub #name: #ty, }
        } else if let Some(default) = default {
            let zero = matches!(default, Value::Bool(false))
                || default.as_f64() == Some(0.0)
                || default.as_str() == Some("");
            if !zero {
                return Err(format!(
                    "operation `{}`: query parameter `{}` defaults to {default}; the server only \
                     takes defaults that are the type's own (false, 0, \"\"), so leave it out or make it optional",
                    op.id, arg.name
                ));
            }
            quote! { #[doc = #doc] #[serde(default)] pub #name: #ty, }
        } else {
            quote! { #[doc = #doc] pub #name: ::std::option::Option<#ty>, }
        });
    }
    let ident = query_type(op);
    let doc = format!(" The query of `{}`.", op.id);
    Ok(Some(quote! {
        #[doc = #doc]
        #[derive(Debug, Clone, ::serde::Deserialize)]
        pub struct #ident {
            #(#fields)*
        }
    }))
}

/// What a method answers with: the generated response type, or the NDJSON stream.
fn response_type(spec: &Spec, op: &Operation) -> Result<TokenStream, String> {
    if op.streaming {
        return Ok(quote!(crate::server::Ndjson));
    }
    if op.websocket {
        return Ok(quote!(::axum::response::Response));
    }
    let name = response_component(spec, op)?;
    let ident = format_ident!("{name}");
    Ok(quote!(crate::types::#ident))
}

/// The component the success response refers to.
fn response_component(spec: &Spec, op: &Operation) -> Result<String, String> {
    let path = spec
        .api
        .paths
        .paths
        .get(&op.path)
        .and_then(|p| p.as_item())
        .ok_or_else(|| format!("operation `{}`: its path is gone", op.id))?;
    let operation = match op.method.as_str() {
        "GET" => &path.get,
        "PUT" => &path.put,
        "POST" => &path.post,
        "DELETE" => &path.delete,
        _ => &path.patch,
    };
    let response = operation
        .as_ref()
        .and_then(|o| {
            o.responses
                .responses
                .get(&openapiv3::StatusCode::Code(op.status))
        })
        .and_then(|r| r.as_item())
        .and_then(|r| r.content.get("application/json"))
        .and_then(|m| m.schema.as_ref());
    match response {
        Some(openapiv3::ReferenceOr::Reference { reference }) => reference
            .strip_prefix("#/components/schemas/")
            .map(String::from)
            .ok_or_else(|| format!("operation `{}`: unsupported response reference", op.id)),
        _ => Err(format!(
            "operation `{}`: its success response must be a $ref to components/schemas, so the \
             server has a named type to answer with",
            op.id
        )),
    }
}

/// The trait method of `op` and the router's handler for it.
fn operation(spec: &Spec, op: &Operation) -> Result<(TokenStream, TokenStream), String> {
    if op.id == "rejected" {
        return Err("operationId `rejected` is taken by the server trait itself".into());
    }
    let method = format_ident!("{}", op.id);
    let response = response_type(spec, op)?;
    let mut params = Vec::new();
    let mut extract = vec![quote!(::axum::extract::State(api): ::axum::extract::State<A>)];
    let mut args = Vec::new();
    if op.tenant_scoped {
        params.push(quote!(caller: crate::server::Caller));
        extract.push(quote!(caller: crate::server::Caller));
        args.push(quote!(caller));
    }
    let mut checks = Vec::new();
    if has_sandbox_id(op) {
        params.push(quote!(sandbox_id: crate::types::SandboxId));
        // Checked after the query and the body are read, so that a malformed one of those is
        // refused as such whatever the id.
        extract.push(quote!(sandbox_id: ::std::result::Result<crate::types::SandboxId, ::axum::response::Response>));
        checks.push(quote! {
            let sandbox_id = match sandbox_id {
                Ok(id) => id,
                Err(rejection) => return rejection,
            };
        });
        args.push(quote!(sandbox_id));
    }
    let others = path_args(op);
    if !others.is_empty() {
        extract.push(quote!(::axum::extract::Path(mut path): ::axum::extract::Path<::std::collections::HashMap<::std::string::String, ::std::string::String>>));
    }
    let mut takes = Vec::new();
    for arg in others {
        let name = format_ident!("{}", arg.name);
        let key = arg.name.as_str();
        params.push(quote!(#name: ::std::string::String));
        takes.push(quote! { let #name = path.remove(#key).unwrap_or_default(); });
        args.push(quote!(#name));
    }
    if !query_args(op).is_empty() {
        let query = query_type(op);
        params.push(quote!(query: #query));
        extract.push(
            quote!(crate::server::ApiQuery(query): crate::server::ApiQuery<crate::server::#query>),
        );
        args.push(quote!(query));
    }
    if op.websocket {
        params.push(quote!(upgrade: crate::server::WebSocketUpgrade));
        extract.push(quote!(upgrade: crate::server::WebSocketUpgrade));
        args.push(quote!(upgrade));
    }
    if op.raw_body {
        params.push(quote!(body: ::axum::body::Body));
        extract.push(quote!(body: ::axum::body::Body));
        args.push(quote!(body));
    } else if let Some(body) = &op.body_type {
        let ty = format_ident!("{body}");
        params.push(quote!(body: crate::types::#ty));
        extract.push(if op.body_required {
            quote!(crate::server::ApiJson(body): crate::server::ApiJson<crate::types::#ty>)
        } else {
            quote!(crate::server::ApiJsonOrEmpty(body): crate::server::ApiJsonOrEmpty<crate::types::#ty>)
        });
        args.push(quote!(body));
    }
    let answer = if op.streaming || op.websocket {
        quote!(::axum::response::IntoResponse::into_response(answer))
    } else if op.status == 200 {
        quote!(::axum::response::IntoResponse::into_response(::axum::Json(
            answer
        )))
    } else {
        let status = match op.status {
            201 => quote!(CREATED),
            202 => quote!(ACCEPTED),
            other => {
                return Err(format!(
                    "operation `{}`: success status {other} with a body; the server answers 200, 201 or 202",
                    op.id
                ));
            }
        };
        quote! {
            ::axum::response::IntoResponse::into_response((
                ::axum::http::StatusCode::#status,
                ::axum::Json(answer),
            ))
        }
    };
    let doc = format!(
        " `{} {}`{}",
        op.method,
        op.path,
        op.summary
            .as_deref()
            .map(|s| format!(": {s}"))
            .unwrap_or_default()
    );
    let method_decl = quote! {
        #[doc = #doc]
        fn #method(
            &self,
            #(#params),*
        ) -> impl ::std::future::Future<Output = ::std::result::Result<#response, Self::Error>> + Send;
    };
    let handler = quote! {
        pub(super) async fn #method<A: super::EngineApi>(#(#extract),*) -> ::axum::response::Response {
            #(#checks)*
            #(#takes)*
            match api.#method(#(#args),*).await {
                Ok(answer) => #answer,
                Err(e) => ::axum::response::IntoResponse::into_response(e),
            }
        }
    };
    Ok((method_decl, handler))
}

/// The router: every path of the spec with its operations, each under its method; an upload
/// (`application/octet-stream`) streams to its handler without the body limit.
fn routes(spec: &Spec) -> Vec<TokenStream> {
    let mut paths: Vec<&str> = Vec::new();
    for op in &spec.operations {
        if !paths.contains(&op.path.as_str()) {
            paths.push(&op.path);
        }
    }
    paths
        .into_iter()
        .map(|path| {
            let ops: Vec<&Operation> = spec.operations.iter().filter(|o| o.path == path).collect();
            let routers = ops.iter().map(|op| {
                let verb = format_ident!("{}", op.method.to_ascii_lowercase());
                let handler = format_ident!("{}", op.id);
                let router = quote!(::axum::routing::#verb(handlers::#handler::<A>));
                if op.raw_body {
                    quote!(#router.layer(::axum::extract::DefaultBodyLimit::disable()))
                } else {
                    router
                }
            });
            let mut routers = routers.collect::<Vec<_>>().into_iter();
            let first = routers.next().unwrap_or_default();
            quote! { .route(#path, #first #(.merge(#routers))*) }
        })
        .collect()
}

pub fn generate(spec: &Spec) -> Result<TokenStream, String> {
    let mut methods = Vec::new();
    let mut handlers = Vec::new();
    let mut queries = Vec::new();
    for op in &spec.operations {
        let (method, handler) = operation(spec, op)?;
        methods.push(method);
        handlers.push(handler);
        queries.extend(query_struct(op)?);
    }
    let routes = routes(spec);
    Ok(quote! {
        /// The engine's API: one method per operation of the spec, on the generated types. The
        /// router ([`router`]) extracts what each takes — the caller, a checked sandbox id, other
        /// path parameters, the query, the body — and answers with the spec's success status.
        pub trait EngineApi: Clone + Send + Sync + 'static {
            /// What a method fails with; its response is the API's error.
            type Error: ::axum::response::IntoResponse + Send + 'static;

            /// The error for a request the router refused before calling a method.
            fn rejected(rejection: crate::server::Rejection) -> Self::Error;

            #(#methods)*
        }

        #(#queries)*

        /// Every operation of the spec, routed to its method of `A`. Add the fallbacks, the body
        /// limit and authentication around it, then its state.
        pub fn router<A: EngineApi>() -> ::axum::Router<A> {
            ::axum::Router::new()
                #(#routes)*
        }

        mod handlers {
            #(#handlers)*
        }
    })
}
