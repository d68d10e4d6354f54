//! Desktop sandboxes for computer use: a sandbox like any other, whose record holds a screen
//! size. Its agent runs the display; every desktop call carries the size, so a display that is
//! gone (a restore stopped every process, the agent was restarted) comes back by itself.

use std::sync::Arc;
use std::time::Duration;

use super::agent::AgentClient;
use super::catalog::Catalog;
use super::lifecycle::Lifecycle;
use super::pool::Pools;
use super::registry::Registry;
use super::{CreateRequest, SandboxView};
use crate::driver::DriverHandle;
use crate::error::EngineError;
use sandbox_mcp_protocol::keys;
use sandbox_mcp_protocol::{Input, InputAction, Screen, Screenshot, Shot, StartDesktop};
use sandbox_mcp_storage::templates::DESKTOP;
use sandbox_mcp_sys::lock;

/// The display every desktop uses (`DISPLAY`, set for every command): the agent's.
pub(crate) use sandbox_mcp_protocol::DISPLAY;
/// Smallest and largest screens: a PNG of the largest fits the agent's reply frame.
pub(crate) const MIN_SCREEN: Screen = Screen {
    width: 320,
    height: 200,
};
pub(crate) const MAX_SCREEN: Screen = Screen {
    width: 2560,
    height: 1600,
};
/// Starting the display server (Xvfb's first start compiles its keymap).
const START_DEADLINE: Duration = Duration::from_secs(30);
/// A screenshot or an action, with the agent's own 30 s limit on the display's answers inside.
const CALL_DEADLINE: Duration = Duration::from_secs(40);
/// Longest `wait` action.
pub(crate) const MAX_WAIT_SECONDS: u32 = 30;

/// One mouse or keyboard action, checked against the screen; `Wait` never reaches the agent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    Input(InputAction),
    Wait(Duration),
}

/// Parses `1280x800` within [`MIN_SCREEN`]..=[`MAX_SCREEN`].
pub fn parse_resolution(s: &str) -> Result<Screen, EngineError> {
    let bad = || {
        EngineError::InvalidArgument(format!(
            "resolution {s:?} is not WIDTHxHEIGHT between {}x{} and {}x{} (e.g. 1280x800)",
            MIN_SCREEN.width, MIN_SCREEN.height, MAX_SCREEN.width, MAX_SCREEN.height
        ))
    };
    let (w, h) = s.split_once('x').ok_or_else(bad)?;
    let (width, height): (u16, u16) =
        (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
    if !(MIN_SCREEN.width..=MAX_SCREEN.width).contains(&width)
        || !(MIN_SCREEN.height..=MAX_SCREEN.height).contains(&height)
    {
        return Err(bad());
    }
    Ok(Screen { width, height })
}

/// Checks a point against the screen; the error names the screen's size.
pub(crate) fn on_screen(
    screen: Screen,
    what: &str,
    x: Option<u32>,
    y: Option<u32>,
) -> Result<Option<(u16, u16)>, EngineError> {
    match (x, y) {
        (None, None) => Ok(None),
        (Some(x), Some(y)) if x < u32::from(screen.width) && y < u32::from(screen.height) => {
            Ok(Some((x as u16, y as u16)))
        }
        (Some(x), Some(y)) => Err(EngineError::InvalidArgument(format!(
            "{what} ({x}, {y}) is off the {}x{} screen: x must be 0-{} and y 0-{}",
            screen.width,
            screen.height,
            screen.width - 1,
            screen.height - 1
        ))),
        _ => Err(EngineError::InvalidArgument(format!(
            "{what} needs both coordinates: give x and y together"
        ))),
    }
}

/// What an API action request asks for, checked against the screen.
#[derive(Debug, Default)]
pub struct ActionRequest<'a> {
    pub action: &'a str,
    pub x: Option<u32>,
    pub y: Option<u32>,
    pub to_x: Option<u32>,
    pub to_y: Option<u32>,
    pub text: Option<&'a str>,
    pub keys: Option<&'a str>,
    pub button: Option<&'a str>,
    pub direction: Option<&'a str>,
    pub amount: Option<u32>,
}

impl ActionRequest<'_> {
    /// The action, or a 400 that says which argument is missing or wrong.
    pub(crate) fn check(&self, screen: Screen) -> Result<Action, EngineError> {
        let need = |what: &str| {
            EngineError::InvalidArgument(format!("action {} needs {what}", self.action))
        };
        let at = on_screen(screen, "the point", self.x, self.y)?;
        let button = |default: u8| match self.button {
            None => Ok(default),
            Some("left") => Ok(1),
            Some("middle") => Ok(2),
            Some("right") => Ok(3),
            Some(other) => Err(EngineError::InvalidArgument(format!(
                "button {other:?} is not left, middle or right"
            ))),
        };
        let input = match self.action {
            "move" => {
                let (x, y) = at.ok_or_else(|| need("x and y"))?;
                InputAction::Move { x, y }
            }
            "click" | "double_click" => InputAction::Click {
                at,
                button: button(1)?,
                count: if self.action == "click" { 1 } else { 2 },
            },
            "right_click" => InputAction::Click {
                at,
                button: 3,
                count: 1,
            },
            "middle_click" => InputAction::Click {
                at,
                button: 2,
                count: 1,
            },
            "drag" => {
                let from = at.ok_or_else(|| need("x and y (where the drag starts)"))?;
                let to = on_screen(screen, "the drag's end", self.to_x, self.to_y)?
                    .ok_or_else(|| need("to_x and to_y (where the drag ends)"))?;
                InputAction::Drag { from, to }
            }
            "scroll" => {
                let button = match self.direction {
                    Some("up") => 4,
                    Some("down") => 5,
                    Some("left") => 6,
                    Some("right") => 7,
                    Some(other) => {
                        return Err(EngineError::InvalidArgument(format!(
                            "direction {other:?} is not up, down, left or right"
                        )));
                    }
                    None => return Err(need("direction (up, down, left or right)")),
                };
                let amount = self.amount.unwrap_or(3).clamp(1, 30) as u8;
                InputAction::Scroll { at, button, amount }
            }
            "type" => {
                let text = self.text.ok_or_else(|| need("text"))?;
                keys::check_text(text).map_err(EngineError::InvalidArgument)?;
                InputAction::Type {
                    text: text.to_string(),
                }
            }
            "key" => {
                let keys = self
                    .keys
                    .ok_or_else(|| need("keys (like ctrl+s or Return)"))?;
                keys::parse(keys).map_err(EngineError::InvalidArgument)?;
                InputAction::Key {
                    keys: keys.to_string(),
                }
            }
            "wait" => {
                let seconds = self.amount.unwrap_or(1);
                if !(1..=MAX_WAIT_SECONDS).contains(&seconds) {
                    return Err(EngineError::InvalidArgument(format!(
                        "wait takes 1-{MAX_WAIT_SECONDS} seconds in amount"
                    )));
                }
                return Ok(Action::Wait(Duration::from_secs(u64::from(seconds))));
            }
            other => {
                return Err(EngineError::InvalidArgument(format!(
                    "unknown action {other:?}: use move, click, double_click, right_click, middle_click, drag, scroll, type, key or wait"
                )));
            }
        };
        Ok(Action::Input(input))
    }
}

/// Desktops: sandboxes with a display, and what a model does with it.
pub struct Desktops {
    driver: DriverHandle,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    lifecycle: Arc<Lifecycle>,
    agent: Arc<AgentClient>,
    pools: Arc<Pools>,
}

impl Desktops {
    pub(crate) fn new(
        driver: DriverHandle,
        registry: Arc<Registry>,
        catalog: Arc<Catalog>,
        lifecycle: Arc<Lifecycle>,
        agent: Arc<AgentClient>,
        pools: Arc<Pools>,
    ) -> Self {
        Self {
            driver,
            registry,
            catalog,
            lifecycle,
            agent,
            pools,
        }
    }

    /// Creates a sandbox and starts its desktop; a sandbox whose desktop cannot start is killed
    /// again, so a failed call leaves nothing behind. To its end
    /// ([`super::lifecycle::Lifecycle::to_the_end`]).
    pub async fn create_computer(
        self: &Arc<Self>,
        req: CreateRequest,
        screen: Screen,
    ) -> Result<SandboxView, EngineError> {
        let this = self.clone();
        self.lifecycle
            .to_the_end(async move { this.create_computer_now(req, screen).await })
            .await
    }

    async fn create_computer_now(
        &self,
        mut req: CreateRequest,
        screen: Screen,
    ) -> Result<SandboxView, EngineError> {
        if req.template.is_none() {
            if self.catalog.template(DESKTOP).is_err()
                && self.driver.capabilities().image_templates.is_some()
            {
                return Err(EngineError::InvalidArgument(format!(
                    "there is no `{DESKTOP}` template: on the {} driver templates are images; start the engine with --template-image {DESKTOP}=IMAGE (an image with Xvfb), or name such a template",
                    self.driver.capabilities().name
                )));
            }
            if self.catalog.template(DESKTOP).is_err() {
                return Err(EngineError::InvalidArgument(format!(
                    "there is no `{DESKTOP}` template: the engine's host has no Xvfb. Install it there (apt-get install xvfb; matchbox-window-manager for a window manager) and restart the engine, or name a template that has Xvfb"
                )));
            }
            req.template = Some(DESKTOP.into());
        }
        req.desktop = Some(screen);
        req.env.retain(|(name, _)| name != "DISPLAY");
        req.env.push(("DISPLAY".into(), DISPLAY.into()));
        let tenant = req.tenant.clone();
        let view = self.pools.create(req).await?;
        let id = view.record.id.clone();
        match self
            .agent
            .call(
                &id,
                tenant.as_deref(),
                StartDesktop { screen },
                START_DEADLINE,
            )
            .await
        {
            Ok(_) => Ok(view),
            Err(e) => {
                let _ = self.lifecycle.kill(&id, tenant.as_deref()).await;
                Err(e)
            }
        }
    }

    /// The sandbox's screen, or a 409 saying how to get a desktop.
    pub fn desktop_of(&self, id: &str, tenant: Option<&str>) -> Result<Screen, EngineError> {
        let entry = self.registry.entry(id, tenant)?;
        let desktop = lock(&entry.record).desktop;
        desktop.ok_or_else(|| {
            EngineError::Conflict(format!(
                "sandbox {id} has no desktop (it was made with sandbox_create); make one with computer_create"
            ))
        })
    }

    pub async fn screenshot(
        &self,
        id: &str,
        tenant: Option<&str>,
        scale: f64,
        settle: bool,
    ) -> Result<(Screen, Shot), EngineError> {
        let screen = self.desktop_of(id, tenant)?;
        let shot = self
            .agent
            .call(
                id,
                tenant,
                Screenshot {
                    screen,
                    scale,
                    settle,
                },
                CALL_DEADLINE,
            )
            .await?;
        Ok((screen, shot))
    }

    /// Performs one action; returns where the pointer is afterwards.
    pub async fn computer_action(
        &self,
        id: &str,
        tenant: Option<&str>,
        request: &ActionRequest<'_>,
    ) -> Result<(i32, i32), EngineError> {
        let screen = self.desktop_of(id, tenant)?;
        let action = match request.check(screen)? {
            Action::Wait(d) => {
                tokio::time::sleep(d).await;
                // Then only where the pointer is: a click of no presses does nothing else.
                InputAction::Click {
                    at: None,
                    button: 1,
                    count: 0,
                }
            }
            Action::Input(input) => input,
        };
        let done = self
            .agent
            .call(id, tenant, Input { screen, action }, CALL_DEADLINE)
            .await?;
        Ok((done.cursor_x, done.cursor_y))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const SCREEN: Screen = Screen {
        width: 1280,
        height: 800,
    };

    fn check(r: ActionRequest<'_>) -> Result<Action, String> {
        r.check(SCREEN).map_err(|e| e.to_string())
    }

    #[test]
    fn resolutions_are_checked() {
        assert_eq!(parse_resolution("1280x800").unwrap(), SCREEN);
        for bad in [
            "1280",
            "x800",
            "100x100",
            "4000x2000",
            "1280x800x24",
            "-1x5",
            "",
        ] {
            let e = parse_resolution(bad).unwrap_err().to_string();
            assert!(e.contains("320x200 and 2560x1600"), "{bad}: {e}");
        }
    }

    /// Checks `r` on the test screen and asserts it is refused with words containing each of
    /// `says`.
    fn refused(r: ActionRequest<'_>, says: &[&str]) {
        let action = r.action;
        let e = check(r).unwrap_err();
        for words in says {
            assert!(e.contains(words), "{action}: {e}");
        }
    }

    #[test]
    fn coordinates_off_the_screen_name_its_size() {
        refused(
            ActionRequest {
                action: "click",
                x: Some(1280),
                y: Some(10),
                ..Default::default()
            },
            &[
                "(1280, 10) is off the 1280x800 screen",
                "x must be 0-1279 and y 0-799",
            ],
        );
        refused(
            ActionRequest {
                action: "drag",
                x: Some(1),
                y: Some(1),
                to_x: Some(5),
                to_y: Some(900),
                ..Default::default()
            },
            &["the drag's end (5, 900)"],
        );
        refused(
            ActionRequest {
                action: "move",
                x: Some(3),
                ..Default::default()
            },
            &["give x and y together"],
        );
    }

    #[test]
    fn each_action_says_what_it_is_missing() {
        for (action, missing) in [
            ("move", "needs x and y"),
            ("drag", "needs x and y"),
            ("scroll", "needs direction"),
            ("type", "needs text"),
            ("key", "needs keys"),
            ("fly", "unknown action \"fly\""),
        ] {
            refused(
                ActionRequest {
                    action,
                    ..Default::default()
                },
                &[missing],
            );
        }
        refused(
            ActionRequest {
                action: "key",
                keys: Some("ctrl+nope"),
                ..Default::default()
            },
            &["unknown key \"nope\""],
        );
        refused(
            ActionRequest {
                action: "wait",
                amount: Some(31),
                ..Default::default()
            },
            &["1-30 seconds"],
        );
    }

    #[test]
    fn actions_map_to_input() {
        let a = check(ActionRequest {
            action: "double_click",
            x: Some(10),
            y: Some(20),
            button: Some("right"),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            a,
            Action::Input(InputAction::Click {
                at: Some((10, 20)),
                button: 3,
                count: 2
            })
        );
        let a = check(ActionRequest {
            action: "scroll",
            direction: Some("down"),
            amount: Some(5),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            a,
            Action::Input(InputAction::Scroll {
                at: None,
                button: 5,
                amount: 5
            })
        );
        assert_eq!(
            check(ActionRequest {
                action: "wait",
                ..Default::default()
            })
            .unwrap(),
            Action::Wait(Duration::from_secs(1))
        );
    }
}
