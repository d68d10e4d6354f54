//! What passes through a hosted server's session besides tool calls: progress notifications,
//! resources, prompts and completions; requests from the server to the client (sampling) when the
//! client declared them, refused cleanly when not; and the protocol revision the client asked
//! for, whatever the server inside speaks.

// Sampling is deprecated in the newest revision, and still part of the ones served here.
#![allow(deprecated)]

use std::sync::Mutex;

use rmcp::model::RequestParamsMeta;
use rmcp::model::{
    ClientCapabilities, ClientInfo, CreateMessageRequestParams, CreateMessageResult,
    Implementation, ProgressNotificationParam, ProtocolVersion, SamplingMessage,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ClientHandler, ErrorData, RoleClient};

use super::*;

/// A client that answers sampling requests and counts progress notifications.
#[derive(Clone, Default)]
struct Sampler {
    progress: Arc<Mutex<Vec<f64>>>,
    sampled: Arc<Mutex<u32>>,
    declare_sampling: bool,
}

impl ClientHandler for Sampler {
    fn get_info(&self) -> ClientInfo {
        let capabilities = if self.declare_sampling {
            ClientCapabilities::builder().enable_sampling().build()
        } else {
            ClientCapabilities::default()
        };
        ClientInfo::new(capabilities, Implementation::new("fidelity-test", "0"))
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }

    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        *self.sampled.lock().unwrap() += 1;
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text("the client's model says hi"),
            "test-model".into(),
        ))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params.progress);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_resources_prompts_and_completions_pass_through() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    hosted
        .register_ok(None, "everything", reference_registration("everything"))
        .await;
    let token = hosted.token("alice");
    let handler = Sampler::default();
    let client = hosted
        .connect_with("everything", &token, handler.clone())
        .await;
    let peer = client.peer();
    // Progress: the server's notifications reach the client while the call runs.
    let mut params = CallToolRequestParams::new("trigger-long-running-operation").with_arguments(
        json!({"duration": 2, "steps": 4})
            .as_object()
            .cloned()
            .unwrap(),
    );
    params.set_progress_token(rmcp::model::ProgressToken(
        rmcp::model::NumberOrString::Number(7),
    ));
    let r = peer.call_tool(params).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{}", said(&r));
    let seen = handler.progress.lock().unwrap().clone();
    assert!(seen.len() >= 2, "progress notifications: {seen:?}");
    // Resources, prompts and completions, as the server has them.
    let resources = peer.list_all_resources().await.unwrap();
    assert!(!resources.is_empty());
    let read = peer
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            resources[0].uri.clone(),
        ))
        .await
        .unwrap();
    assert!(!read.contents.is_empty());
    let prompts = peer.list_all_prompts().await.unwrap();
    assert!(
        prompts.iter().any(|p| p.name.contains("simple")),
        "{prompts:?}"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_reaches_a_client_that_declared_it_and_is_refused_otherwise() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    hosted
        .register_ok(None, "everything", reference_registration("everything"))
        .await;
    let token = hosted.token("alice");
    for declared in [true, false] {
        let handler = Sampler {
            declare_sampling: declared,
            ..Sampler::default()
        };
        let client = hosted
            .connect_with("everything", &token, handler.clone())
            .await;
        let tools = tool_names(client.peer()).await;
        let Some(sampling_tool) = tools.iter().find(|t| t.contains("sampling")) else {
            // The server offers it only to clients that declared sampling.
            assert!(!declared, "{tools:?}");
            client.cancel().await.unwrap();
            continue;
        };
        let r = tool(
            client.peer(),
            sampling_tool,
            json!({"prompt": "hello", "maxTokens": 10}),
        )
        .await;
        if declared {
            assert_eq!(*handler.sampled.lock().unwrap(), 1);
            assert!(
                said(&r).contains("the client's model says hi"),
                "{}",
                said(&r)
            );
        } else {
            assert_eq!(*handler.sampled.lock().unwrap(), 0);
            assert!(said(&r).contains("sampling"), "{}", said(&r));
        }
        client.cancel().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_gets_the_revision_it_asked_for() {
    crate::require_reference_servers!();
    let hosted = Hosted::start(None).await;
    // mcp-server-time's SDK answers initialize with its own revision.
    hosted
        .register_ok(None, "time", reference_registration("time"))
        .await;
    let token = hosted.token("alice");
    for version in [ProtocolVersion::V_2025_06_18, ProtocolVersion::V_2025_11_25] {
        let config = rmcp::model::ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("versions", "0"),
        )
        .with_protocol_version(version.clone());
        let client = hosted.client_at("/servers/time/mcp", &token, config).await;
        let info = client.peer().peer_info().unwrap();
        assert_eq!(info.protocol_version, version);
        let r = tool(
            client.peer(),
            "get_current_time",
            json!({"timezone": "UTC"}),
        )
        .await;
        assert!(said(&r).contains("UTC"));
        client.cancel().await.unwrap();
    }
    // A client that asks for 2026-07-28 in initialize gets the latest revision with a handshake.
    let client = hosted.connect("time", &token).await;
    let info = client.peer().peer_info().unwrap();
    assert_eq!(info.protocol_version, ProtocolVersion::V_2025_11_25);
    let r = tool(
        client.peer(),
        "get_current_time",
        json!({"timezone": "UTC"}),
    )
    .await;
    assert!(said(&r).contains("UTC"));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn mounted_servers_pass_progress_and_sampling_through_our_endpoint() {
    crate::require_reference_servers!();
    let hosted = Hosted::start_with(
        None,
        |o| o.mount_servers = vec!["everything".into()],
        "core",
    )
    .await;
    hosted
        .register_ok(None, "everything", reference_registration("everything"))
        .await;
    let token = hosted.token("alice");
    let handler = Sampler {
        declare_sampling: true,
        ..Sampler::default()
    };
    let client = hosted.client_at("/mcp", &token, handler.clone()).await;
    let peer = client.peer();
    let tools = tool_names(peer).await;
    let mut params = CallToolRequestParams::new("everything__trigger-long-running-operation")
        .with_arguments(
            json!({"duration": 2, "steps": 4})
                .as_object()
                .cloned()
                .unwrap(),
        );
    params.set_progress_token(rmcp::model::ProgressToken(
        rmcp::model::NumberOrString::Number(9),
    ));
    let r = peer.call_tool(params).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{}", said(&r));
    assert!(
        handler.progress.lock().unwrap().len() >= 2,
        "progress through the mount"
    );
    if let Some(sampling) = tools
        .iter()
        .find(|t| t.starts_with("everything__") && t.contains("sampling"))
    {
        let r = tool(peer, sampling, json!({"prompt": "hello", "maxTokens": 10})).await;
        assert!(
            said(&r).contains("the client's model says hi"),
            "{}",
            said(&r)
        );
        assert_eq!(*handler.sampled.lock().unwrap(), 1);
    }
    // Prompts and resources of the mounted server, beside our tools.
    let prompts = peer.list_all_prompts().await.unwrap();
    assert!(
        prompts.iter().any(|p| p.name.starts_with("everything__")),
        "{prompts:?}"
    );
    let resources = peer.list_all_resources().await.unwrap();
    assert!(!resources.is_empty());
    let read = peer
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            resources[0].uri.clone(),
        ))
        .await
        .unwrap();
    assert!(!read.contents.is_empty());
    client.cancel().await.unwrap();
}
