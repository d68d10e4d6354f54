//! Landlock, where the kernel has it: a second, unprivileged layer under the namespaces.
//!
//! Inside the sandbox everything below `/` stays usable except creating device nodes, and the
//! sandbox's processes are scoped so they cannot signal processes or reach abstract unix sockets
//! outside their Landlock domain. TCP is not restricted here (servers on the sandbox's own
//! loopback must keep working; the network namespace already cuts it off from the host).

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, RestrictionStatus,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

/// Highest ABI this policy is written for; older kernels get the subset they support.
const ABI_TARGET: ABI = ABI::V6;

/// Applies the policy to the calling process. `exe` is the agent binary, which lives outside the
/// sandbox's root and must stay executable. Returns whether it was (fully or partly) enforced;
/// `Ok(false)` when the kernel has no Landlock.
pub fn restrict(exe: &impl std::os::fd::AsFd) -> Result<bool, String> {
    let all = AccessFs::from_all(ABI_TARGET);
    let allowed = all & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let status: RestrictionStatus = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| r.create())
        .map_err(|e| format!("landlock: {e}"))?
        .add_rule(PathBeneath::new(
            PathFd::new("/").map_err(|e| format!("landlock: {e}"))?,
            allowed,
        ))
        .and_then(|r| {
            r.add_rule(PathBeneath::new(
                exe.as_fd(),
                AccessFs::Execute | AccessFs::ReadFile,
            ))
        })
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("landlock: {e}"))?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}
