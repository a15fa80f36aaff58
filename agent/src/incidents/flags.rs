//! The incidents' settings as users give them: one declaration each, at once the flag, the
//! `KSTALL_*` variable and the file's key (`config.rs` merges the layers), read into
//! [`Settings`] with the incidents' own bounds.

use crate::setting::{Invalid, count, duration};

use super::Settings;

#[derive(Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
// A group id of its own: clap names a flattened struct's group after the type.
#[group(id = "incident_settings")]
pub struct Flags {
    /// Destination ports whose redirected, reset connections are NFS captured by a proxy
    /// [default: 2049,111,20048].
    #[arg(long, env = "KSTALL_NFS_PORTS", value_name = "LIST", value_delimiter = ',')]
    pub nfs_ports: Option<Vec<String>>,
    /// Redirected NFS resets within --redirect-window that fire nfs-sidecar-redirect, once they
    /// persist for 2 s: at least 2 [default: 2].
    #[arg(long, env = "KSTALL_REDIRECT_MIN_RESETS", value_name = "N")]
    pub redirect_min_resets: Option<String>,
    /// [default: 10m].
    #[arg(long, env = "KSTALL_REDIRECT_WINDOW", value_name = "DURATION")]
    pub redirect_window: Option<String>,
    /// No redirected resets for this long (and RPCs completing) resolves nfs-sidecar-redirect
    /// [default: 60s].
    #[arg(long, env = "KSTALL_QUIET_WINDOW", value_name = "DURATION")]
    pub quiet_window: Option<String>,
    /// A pod's task hung this long fires pod-termination-blocked [default: 60s].
    #[arg(long, env = "KSTALL_TERMINATION_BLOCKED_AFTER", value_name = "DURATION")]
    pub termination_blocked_after: Option<String>,
    /// OOM kills of one container within --oom-loop-window that fire container-oom-loop [default: 3].
    #[arg(long, env = "KSTALL_OOM_LOOP_COUNT", value_name = "N")]
    pub oom_loop_count: Option<String>,
    /// [default: 1h].
    #[arg(long, env = "KSTALL_OOM_LOOP_WINDOW", value_name = "DURATION")]
    pub oom_loop_window: Option<String>,
    /// How long system-oom keeps firing after the last global OOM kill [default: 10m].
    #[arg(long, env = "KSTALL_SYSTEM_OOM_HOLD", value_name = "DURATION")]
    pub system_oom_hold: Option<String>,
    /// Pods with tasks stuck in NFS at once that make nfs-node-wide-stall [default: 2].
    #[arg(long, env = "KSTALL_NODE_WIDE_MIN_PODS", value_name = "N")]
    pub node_wide_min_pods: Option<String>,
    /// Pods waiting for an image (ImagePullBackOff, ErrImagePull) that fire kubelet-degraded
    /// [default: 20].
    #[arg(long, env = "KSTALL_KUBELET_IMAGE_PULL_PODS", value_name = "N")]
    pub kubelet_image_pull_pods: Option<String>,
    /// Pods this long past their deletion deadline count as stuck Terminating [default: 5m].
    #[arg(long, env = "KSTALL_KUBELET_TERMINATION_OVERDUE", value_name = "DURATION")]
    pub kubelet_termination_overdue: Option<String>,
    /// Pods stuck Terminating that fire kubelet-degraded [default: 3].
    #[arg(long, env = "KSTALL_KUBELET_STUCK_TERMINATING_PODS", value_name = "N")]
    pub kubelet_stuck_terminating_pods: Option<String>,
    /// A kubelet check failing this long fires kubelet-degraded [default: 30s].
    #[arg(long, env = "KSTALL_KUBELET_UNHEALTHY_AFTER", value_name = "DURATION")]
    pub kubelet_unhealthy_after: Option<String>,
    /// A pod's NFS RPCs to a server slower than this at the 99th percentile (over the last 10 s)
    /// make it slow [default: 500ms].
    #[arg(long, env = "KSTALL_NFS_SLOW_THRESHOLD", value_name = "DURATION")]
    pub nfs_slow_threshold: Option<String>,
    /// Slow this long fires nfs-slow [default: 60s].
    #[arg(long, env = "KSTALL_NFS_SLOW_FOR", value_name = "DURATION")]
    pub nfs_slow_for: Option<String>,
    /// How long cpu-soft-lockup keeps firing after the kernel's last report of the CPU
    /// [default: 5m].
    #[arg(long, env = "KSTALL_CPU_LOCKUP_HOLD", value_name = "DURATION")]
    pub cpu_lockup_hold: Option<String>,
    /// Packets of a pod a firewall rule in its namespace dropped within --policy-drops-window that
    /// fire network-policy-drops [default: 5].
    #[arg(long, env = "KSTALL_POLICY_DROPS_MIN", value_name = "N")]
    pub policy_drops_min: Option<String>,
    /// The window --policy-drops-min counts in [default: 60s].
    #[arg(long, env = "KSTALL_POLICY_DROPS_WINDOW", value_name = "DURATION")]
    pub policy_drops_window: Option<String>,
    /// Percent of the time a pod's (or the node's) tasks wait for memory (PSI some) that, held
    /// for --memory-pressure-for, fires memory-pressure: 1 to 100 [default: 20].
    #[arg(long, env = "KSTALL_MEMORY_PRESSURE_SOME", value_name = "PERCENT")]
    pub memory_pressure_some: Option<String>,
    /// [default: 60s].
    #[arg(long, env = "KSTALL_MEMORY_PRESSURE_FOR", value_name = "DURATION")]
    pub memory_pressure_for: Option<String>,
}

impl Flags {
    /// The settings, each unset one at its default; a bad value names its key.
    pub fn settings(self) -> Result<Settings, Invalid> {
        let mut s = Settings::default();
        let duration = |key, value: Option<String>, default| value.map_or(Ok(default), |t| duration(key, &t));
        let count =
            |key, value: Option<String>, default, min| value.map_or(Ok(default), |t| count(key, &t, min));
        if let Some(list) = self.nfs_ports {
            s.nfs_ports = list
                .iter()
                .map(|p| p.trim())
                .filter(|p| !p.is_empty())
                .map(|p| {
                    p.parse::<u16>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or(("nfs_ports", format!("{p:?} is not a port")))
                })
                .collect::<Result<_, _>>()?;
            if s.nfs_ports.is_empty() {
                return Err(("nfs_ports", "no port given".into()));
            }
        }
        s.redirect_min_resets = count(
            "redirect_min_resets",
            self.redirect_min_resets,
            s.redirect_min_resets,
            Settings::MIN_REDIRECT_RESETS,
        )?;
        s.redirect_window = duration("redirect_window", self.redirect_window, s.redirect_window)?;
        s.quiet_window = duration("quiet_window", self.quiet_window, s.quiet_window)?;
        s.termination_blocked_after = duration(
            "termination_blocked_after",
            self.termination_blocked_after,
            s.termination_blocked_after,
        )?;
        s.oom_loop_count =
            count("oom_loop_count", self.oom_loop_count, s.oom_loop_count, Settings::MIN_OOM_LOOP_COUNT)?;
        s.oom_loop_window = duration("oom_loop_window", self.oom_loop_window, s.oom_loop_window)?;
        s.system_oom_hold = duration("system_oom_hold", self.system_oom_hold, s.system_oom_hold)?;
        s.node_wide_min_pods = count(
            "node_wide_min_pods",
            self.node_wide_min_pods,
            s.node_wide_min_pods,
            Settings::MIN_NODE_WIDE_PODS,
        )?;
        s.kubelet_image_pull_pods = count(
            "kubelet_image_pull_pods",
            self.kubelet_image_pull_pods,
            s.kubelet_image_pull_pods,
            Settings::MIN_KUBELET_IMAGE_PULL_PODS,
        )?;
        s.kubelet_termination_overdue = duration(
            "kubelet_termination_overdue",
            self.kubelet_termination_overdue,
            s.kubelet_termination_overdue,
        )?;
        s.kubelet_stuck_terminating_pods = count(
            "kubelet_stuck_terminating_pods",
            self.kubelet_stuck_terminating_pods,
            s.kubelet_stuck_terminating_pods,
            Settings::MIN_KUBELET_STUCK_TERMINATING_PODS,
        )?;
        s.kubelet_unhealthy_after =
            duration("kubelet_unhealthy_after", self.kubelet_unhealthy_after, s.kubelet_unhealthy_after)?;
        s.nfs_slow_threshold = duration("nfs_slow_threshold", self.nfs_slow_threshold, s.nfs_slow_threshold)?;
        s.nfs_slow_for = duration("nfs_slow_for", self.nfs_slow_for, s.nfs_slow_for)?;
        s.cpu_lockup_hold = duration("cpu_lockup_hold", self.cpu_lockup_hold, s.cpu_lockup_hold)?;
        s.policy_drops_min =
            count("policy_drops_min", self.policy_drops_min, s.policy_drops_min, Settings::MIN_POLICY_DROPS)?;
        s.policy_drops_window =
            duration("policy_drops_window", self.policy_drops_window, s.policy_drops_window)?;
        s.memory_pressure_some_percent = count(
            "memory_pressure_some",
            self.memory_pressure_some,
            s.memory_pressure_some_percent,
            Settings::MIN_MEMORY_PRESSURE_PERCENT,
        )?;
        if s.memory_pressure_some_percent > 100 {
            return Err((
                "memory_pressure_some",
                format!("{} is over 100 percent", s.memory_pressure_some_percent),
            ));
        }
        s.memory_pressure_for =
            duration("memory_pressure_for", self.memory_pressure_for, s.memory_pressure_for)?;
        Ok(s)
    }
}
