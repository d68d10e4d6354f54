//! From arguments to configuration: the data dir every store lives in, and the engine's settings
//! (embedded in `serve`, or standalone in `engine`) as an `EngineConfig`.

use std::path::PathBuf;
use std::time::Duration;

use sandbox_mcp_model::config::{EngineConfig, default_data_dir};

use super::args::{AutoOff, DataDirArg, EgressArg, EngineSettings};

impl DataDirArg {
    pub(super) fn path(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }
}

impl EngineSettings {
    pub(super) fn config(&self) -> EngineConfig {
        let mut config = EngineConfig::new(self.data.path());
        config.max_sandboxes = self.max_sandboxes;
        config.idle_pause = (self.idle_pause > 0).then(|| Duration::from_secs(self.idle_pause));
        config.idle_hibernate =
            (self.idle_hibernate > 0).then(|| Duration::from_secs(self.idle_hibernate));
        config.disk_limits = match self.disk_limits {
            AutoOff::Auto => sandbox_mcp_model::config::DiskLimits::Auto,
            AutoOff::Off => sandbox_mcp_model::config::DiskLimits::Off,
        };
        config.favordynmods = matches!(self.favordynmods, AutoOff::Auto);
        config.criu = match self.criu.as_str() {
            "auto" => sandbox_mcp_model::config::CriuSetting::Auto,
            "off" => sandbox_mcp_model::config::CriuSetting::Off,
            path => sandbox_mcp_model::config::CriuSetting::Path(path.into()),
        };
        config.network = sandbox_mcp_network::NetworkConfig {
            egress: match self.egress {
                EgressArg::Open => sandbox_mcp_network::EgressDefault::Open,
                EgressArg::Closed => sandbox_mcp_network::EgressDefault::Closed,
            },
            egress_allow: self.egress_allow.clone(),
            dns_upstream: self.dns_upstream.clone(),
            max_connections: self.max_connections.max(1),
            egress_ca: self.egress_ca.clone(),
        };
        let default = sandbox_mcp_model::config::PreviewConfig::default();
        config.preview = sandbox_mcp_model::config::PreviewConfig {
            // An address given explicitly is the operator's choice: taken means fail, not move.
            fallback: self.preview_listen.is_none(),
            listen: self.preview_listen.clone().map_or(default.listen, |l| l.0),
            domain: self.preview_domain.clone(),
        };
        config.default_template = self.default_template.clone();
        config.workspaces = self.workspaces.clone();
        config.warm = self.warm.iter().cloned().collect();
        config
    }
}
