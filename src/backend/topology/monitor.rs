//! The I/O side of a shard's topology: one monitor task per member, feeding the sans-IO
//! [`ShardTopology`] and publishing its version on a `tokio::sync::watch` channel.
//!
//! [`ShardMonitor::start`] takes the shard's seed list and starts a monitor per seed. Each
//! monitor loops on [`ShardTopology::next_check`]: it connects with the shard connection's
//! handshake ([`ShardConnection::connect`]), sends a timed `hello` (a poll, whose duration is a
//! round-trip sample) or, once the member has reported a `topologyVersion`, an awaitable
//! `hello` (`topologyVersion` + `maxAwaitTimeMS`, read timeout `connect_timeout +
//! maxAwaitTime`) that the member answers as soon as its state changes. Replies go to
//! [`ShardTopology::on_hello`], failures to [`ShardTopology::on_monitor_error`], and each
//! [`Update`] is acted on: members discovered get a monitor, members removed lose theirs, a
//! requested check wakes the monitors that are waiting for their next poll. A member monitored
//! by streaming also gets a `ping` every heartbeat on a connection of its own, whose round
//! trip feeds [`ShardTopology::on_rtt_sample`] (awaited replies are not timed).
//!
//! The data path reports what it sees with [`ShardMonitor::report_application_error`] and
//! waits for a member with [`ShardMonitor::select`], which wakes on every topology change.
//! See `docs/design/replica-sets.md` §3.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bson::{doc, Document};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::{BackendError, ShardConnection, ShardSecurity};

use super::address::{HostAddr, SeedList};
use super::error::{Printer, TopologyError};
use super::hello::Hello;
use super::state::{
    ApplicationError, CheckKind, MonitorError, Now, ShardTopology, TopologySettings, Update,
    MIN_HEARTBEAT_FREQUENCY,
};
use super::wait::{MemberWait, Need, WaitStep};

/// Settings of the monitors' connections.
#[derive(Debug, Clone)]
pub struct MonitorOptions {
    /// Time allowed to connect and shake hands, and to answer a polled `hello` or a `ping`.
    pub connect_timeout: Duration,
    /// TLS towards the members (monitoring connections do not authenticate: `hello` and
    /// `ping` need no user).
    pub security: ShardSecurity,
}

impl Default for MonitorOptions {
    fn default() -> Self {
        MonitorOptions {
            connect_timeout: Duration::from_secs(5),
            security: ShardSecurity::default(),
        }
    }
}

/// The clock as the core takes it.
pub fn now() -> Now {
    let wall_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    Now {
        instant: Instant::now(),
        wall_ms,
    }
}

/// What a monitor counts (for tests and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MonitorCounts {
    /// Timed `hello`s sent.
    pub polls: u64,
    /// Awaitable `hello`s sent.
    pub awaitable: u64,
    /// `ping`s sent for round trips.
    pub pings: u64,
    /// Connections opened by the monitor.
    pub connects: u64,
}

struct MemberTasks {
    monitor: JoinHandle<()>,
    rtt: JoinHandle<()>,
}

impl MemberTasks {
    fn abort(&self) {
        self.monitor.abort();
        self.rtt.abort();
    }

    fn is_finished(&self) -> bool {
        self.monitor.is_finished()
    }
}

struct Inner {
    topology: Mutex<ShardTopology>,
    version: watch::Sender<u64>,
    /// Bumped when a check is requested: monitors waiting for a poll wake at once.
    check_requests: watch::Sender<u64>,
    tasks: Mutex<HashMap<HostAddr, MemberTasks>>,
    /// Per member: bumped when the data path marks the member Unknown, to cancel an awaitable
    /// `hello` in flight or about to be sent (the member may never answer it: a connection it
    /// dropped, a state it does not know it lost) and poll instead. A counter rather than a
    /// notification, so a monitor that looks before it plans its check cannot miss a mark
    /// made after its plan and before it listens.
    cancels: Mutex<HashMap<HostAddr, watch::Sender<u64>>>,
    counts: Mutex<HashMap<HostAddr, MonitorCounts>>,
    options: MonitorOptions,
    stopped: std::sync::atomic::AtomicBool,
    /// Clears the data path's pool of a member (set once by the pools' owner).
    pool_clearer: std::sync::OnceLock<PoolClearer>,
}

/// What clears the data path's pool of a member when the topology says so.
pub type PoolClearer = Box<dyn Fn(&HostAddr) + Send + Sync>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One shard's topology and the monitors of its members. Dropping it stops them.
pub struct ShardMonitor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ShardMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardMonitor")
            .field("topology", &*lock(&self.inner.topology))
            .finish()
    }
}

impl ShardMonitor {
    /// Starts monitoring the seed list's members (within a tokio runtime).
    pub fn start(
        seeds: &SeedList,
        settings: TopologySettings,
        options: MonitorOptions,
    ) -> ShardMonitor {
        let monitor = ShardMonitor::new(seeds, settings, options);
        for h in &seeds.hosts {
            spawn_member(&monitor.inner, h.clone());
        }
        monitor
    }

    /// The topology and its channels, no task started yet.
    fn new(seeds: &SeedList, settings: TopologySettings, options: MonitorOptions) -> ShardMonitor {
        let topology = ShardTopology::new(seeds, settings);
        let (version, _) = watch::channel(topology.version());
        let (check_requests, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            topology: Mutex::new(topology),
            version,
            check_requests,
            tasks: Mutex::new(HashMap::new()),
            cancels: Mutex::new(HashMap::new()),
            counts: Mutex::new(HashMap::new()),
            options,
            stopped: std::sync::atomic::AtomicBool::new(false),
            pool_clearer: std::sync::OnceLock::new(),
        });
        ShardMonitor { inner }
    }

    /// Sets what clears a member's pool in the data path: called whenever the topology says
    /// the member's pool must be cleared — a monitor's own failed check (server discovery
    /// clears the pool of a member it marks Unknown, so connections opened before are not
    /// reused) or a failure the data path reported. Set once; later calls are ignored.
    pub fn on_pool_clear(&self, clear: PoolClearer) {
        let _ = self.inner.pool_clearer.set(clear);
    }

    /// A receiver of the topology's version: it changes with every applied change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    /// A copy of the topology as it is now.
    pub fn topology(&self) -> ShardTopology {
        lock(&self.inner.topology).clone()
    }

    /// Runs `f` on the topology under its lock (keep it short: selection, a look).
    pub fn with_topology<R>(&self, f: impl FnOnce(&ShardTopology) -> R) -> R {
        f(&lock(&self.inner.topology))
    }

    /// The members that have a running monitor, in address order.
    pub fn monitored(&self) -> Vec<HostAddr> {
        let mut v: Vec<HostAddr> = lock(&self.inner.tasks)
            .iter()
            .filter(|(_, t)| !t.is_finished())
            .map(|(h, _)| h.clone())
            .collect();
        v.sort();
        v
    }

    /// What `addr`'s monitor has done so far.
    pub fn counts(&self, addr: &HostAddr) -> MonitorCounts {
        lock(&self.inner.counts)
            .get(addr)
            .copied()
            .unwrap_or_default()
    }

    /// Reports a failure the data path saw on `addr`; acts on the update (a check of every
    /// member when the failure says the member's state changed) and returns it (the caller
    /// clears the member's pool when it says so).
    pub fn report_application_error(&self, addr: &HostAddr, error: &ApplicationError) -> Update {
        let (update, unknown) = {
            let mut topology = lock(&self.inner.topology);
            let update = topology.on_application_error(addr, error, now());
            let unknown = topology
                .member(addr)
                .is_some_and(|m| m.server_type() == super::hello::ServerType::Unknown);
            (update, unknown)
        };
        if update.applied && unknown {
            cancel_of(&self.inner, addr).send_modify(|n| *n += 1);
        }
        clear_pool(&self.inner, addr, &update);
        apply(&self.inner, &update);
        update
    }

    /// Asks every monitor to check its member now (what a selection that found nothing does).
    pub fn request_immediate_check(&self) {
        lock(&self.inner.topology).request_immediate_check();
        self.inner.check_requests.send_modify(|n| *n += 1);
    }

    /// Waits for a member that serves `need`, bounded by the selection timeout or
    /// `operation_deadline` (from `maxTimeMS`), whichever comes first; wakes on every topology
    /// change. `random` picks among equally eligible readers.
    pub async fn select(
        &self,
        need: Need,
        operation_deadline: Option<Instant>,
        random: u64,
        printer: &Printer,
    ) -> Result<HostAddr, TopologyError> {
        let mut changes = self.subscribe();
        let wait = {
            let topology = lock(&self.inner.topology);
            MemberWait::new(
                need,
                Instant::now(),
                topology.settings(),
                operation_deadline,
            )
        };
        loop {
            changes.borrow_and_update();
            let step = {
                let topology = lock(&self.inner.topology);
                wait.step(&topology, Instant::now(), random, printer)
            };
            match step {
                WaitStep::Ready(member) => return Ok(member),
                WaitStep::GiveUp(e) => return Err(e),
                WaitStep::Wait {
                    seen_version,
                    until,
                } => {
                    self.request_immediate_check();
                    // Wait for a version newer than the one this step looked at. Not for one
                    // merely different: the published version may lag the topology's for a
                    // moment (a change applied, its publication not sent yet), and a waiter
                    // that took "different" for "changed" stepped again at once, for ever,
                    // without yielding — a few such waiters held every worker of the runtime,
                    // so the monitors could not publish the election they waited for, and
                    // they gave up at the selection timeout (133).
                    let changed = async {
                        while *changes.borrow_and_update() <= seen_version {
                            if changes.changed().await.is_err() {
                                // The monitors are gone: nothing will change before `until`.
                                std::future::pending::<()>().await;
                            }
                        }
                    };
                    let _ = tokio::time::timeout_at(until.into(), changed).await;
                }
            }
        }
    }

    /// Stops every monitor.
    pub fn stop(&self) {
        self.inner
            .stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for (_, t) in lock(&self.inner.tasks).drain() {
            t.abort();
        }
    }
}

#[cfg(test)]
impl ShardMonitor {
    /// A monitor that runs no task (members added later get none either): the test applies
    /// the events itself, with [`ShardMonitor::change`].
    pub(super) fn without_tasks(seeds: &SeedList, settings: TopologySettings) -> ShardMonitor {
        let monitor = ShardMonitor::new(seeds, settings, MonitorOptions::default());
        monitor.stop();
        monitor
    }

    /// Applies an event to the topology, as a monitor task does; `publish: false` stops
    /// half-way, as a task that applied its change and has not published it yet.
    pub(super) fn change(&self, event: impl FnOnce(&mut ShardTopology) -> Update, publish: bool) {
        let update = event(&mut lock(&self.inner.topology));
        if publish {
            apply(&self.inner, &update);
        }
    }

    /// The published topology version.
    pub(super) fn published(&self) -> u64 {
        *self.inner.version.borrow()
    }
}

impl Drop for ShardMonitor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `addr`'s monitor and round-trip task unless they are running.
fn spawn_member(inner: &Arc<Inner>, addr: HostAddr) {
    if inner.stopped.load(std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let mut tasks = lock(&inner.tasks);
    if tasks.get(&addr).is_some_and(|t| !t.is_finished()) {
        return;
    }
    if let Some(old) = tasks.remove(&addr) {
        old.abort();
    }
    let monitor = tokio::spawn(run_monitor(inner.clone(), addr.clone()));
    let rtt = tokio::spawn(run_rtt(inner.clone(), addr.clone()));
    tasks.insert(addr, MemberTasks { monitor, rtt });
}

/// Acts on an update: monitors for members added, none for members removed, a check requested.
fn apply(inner: &Arc<Inner>, update: &Update) {
    if update.applied {
        let v = lock(&inner.topology).version();
        publish(&inner.version, v);
    }
    for h in &update.added {
        spawn_member(inner, h.clone());
    }
    if !update.removed.is_empty() {
        let mut tasks = lock(&inner.tasks);
        for h in &update.removed {
            if let Some(t) = tasks.remove(h) {
                t.abort();
            }
        }
    }
    if update.request_check {
        inner.check_requests.send_modify(|n| *n += 1);
    }
}

/// Publishes topology version `v` unless a newer one is published already. Two updates
/// applied on two threads read the version in one order and may send it in the other: a
/// plain send would put the older version back, and the published version would stay behind
/// the topology's until the next change.
pub(super) fn publish(version: &watch::Sender<u64>, v: u64) {
    version.send_if_modified(|published| {
        if v > *published {
            *published = v;
            true
        } else {
            false
        }
    });
}

fn cancel_of(inner: &Inner, addr: &HostAddr) -> watch::Sender<u64> {
    lock(&inner.cancels)
        .entry(addr.clone())
        .or_insert_with(|| watch::channel(0).0)
        .clone()
}

fn count(inner: &Inner, addr: &HostAddr, f: impl FnOnce(&mut MonitorCounts)) {
    f(lock(&inner.counts).entry(addr.clone()).or_default());
}

fn hello_command(awaitable: Option<(&super::hello::TopologyVersion, Duration)>) -> Document {
    let mut d = doc! {"hello": 1, "$db": "admin"};
    if let Some((tv, wait)) = awaitable {
        d.insert("topologyVersion", tv.to_document());
        d.insert(
            "maxAwaitTimeMS",
            i64::try_from(wait.as_millis()).unwrap_or(i64::MAX),
        );
    }
    d
}

/// One member's monitor: see the module header. Ends when the member leaves the topology.
async fn run_monitor(inner: Arc<Inner>, addr: HostAddr) {
    let target = addr.to_string();
    let timeout = inner.options.connect_timeout;
    let mut conn: Option<ShardConnection> = None;
    let mut checks = inner.check_requests.subscribe();
    let mut cancels = cancel_of(&inner, &addr).subscribe();
    // The first check is due at once.
    let mut last_start: Option<Instant> = None;
    // Set when an awaitable `hello` came back at once with nothing changed (a member that
    // does not wait): the next one is not sent before the minimum heartbeat interval.
    let mut hold_until: Option<Instant> = None;
    loop {
        // Marks made from here on cancel the check planned next (one made before is in the
        // plan: the member is Unknown, and is polled).
        cancels.borrow_and_update();
        let plan = {
            let topology = lock(&inner.topology);
            topology.next_check(&addr, last_start.unwrap_or_else(Instant::now))
        };
        let Some(plan) = plan else {
            return;
        };
        let mut at = if last_start.is_none() {
            Instant::now()
        } else {
            plan.at
        };
        if let Some(h) = hold_until.take() {
            at = at.max(h);
        }
        if at > Instant::now() {
            checks.borrow_and_update();
            let wake_on_request = matches!(plan.kind, CheckKind::Poll);
            tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => {}
                // Holding back an awaitable `hello` and the member was marked Unknown: plan
                // again (a poll) rather than send the awaitable one it may never answer.
                Ok(()) = cancels.changed(), if !wake_on_request => continue,
                r = checks.changed(), if wake_on_request => {
                    if r.is_ok() {
                        // A requested check still keeps the minimum interval between checks.
                        if let Some(prev) = last_start {
                            let earliest = prev + MIN_HEARTBEAT_FREQUENCY;
                            if earliest > Instant::now() {
                                tokio::time::sleep_until(earliest.into()).await;
                            }
                        }
                    }
                }
            }
        }
        let started = Instant::now();
        last_start = Some(started);
        let fresh = conn.is_none();
        if conn.is_none() {
            count(&inner, &addr, |c| c.connects += 1);
            match ShardConnection::connect_with(&target, timeout, &inner.options.security).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(member = %target, error = %e, "monitor cannot connect");
                    report_monitor_error(&inner, &addr, MonitorError::Connect);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        // A new connection starts with a timed `hello`, as a driver's monitor does.
        let (body, read_timeout, timed, sent_tv) = match plan.kind {
            CheckKind::Awaitable {
                topology_version,
                max_await,
            } if !fresh => (
                hello_command(Some((&topology_version, max_await))),
                timeout + max_await,
                false,
                Some(topology_version),
            ),
            _ => (hello_command(None), timeout, true, None),
        };
        count(&inner, &addr, |c| {
            if timed {
                c.polls += 1
            } else {
                c.awaitable += 1
            }
        });
        let result = if timed {
            c.run(&body, read_timeout).await
        } else {
            tokio::select! {
                r = c.run(&body, read_timeout) => r,
                Ok(()) = cancels.changed() => {
                    // The reply may still come: the connection cannot be reused.
                    conn = None;
                    continue;
                }
            }
        };
        let elapsed = started.elapsed();
        match result {
            Ok(reply) => {
                let hello = Hello::from_document(&reply);
                if let (Some(sent), Some(got)) = (sent_tv, hello.topology_version) {
                    if sent == got && elapsed < MIN_HEARTBEAT_FREQUENCY {
                        hold_until = Some(started + MIN_HEARTBEAT_FREQUENCY);
                    }
                }
                let update = {
                    let mut topology = lock(&inner.topology);
                    topology.on_hello(&addr, hello, timed.then_some(elapsed), now())
                };
                apply(&inner, &update);
            }
            Err(e) => {
                tracing::debug!(member = %target, error = %e, "monitor check failed");
                conn = None;
                let kind = match e {
                    BackendError::Protocol(_) if fresh => MonitorError::Connect,
                    _ => MonitorError::Network,
                };
                report_monitor_error(&inner, &addr, kind);
            }
        }
    }
}

fn report_monitor_error(inner: &Arc<Inner>, addr: &HostAddr, error: MonitorError) {
    let update = {
        let mut topology = lock(&inner.topology);
        topology.on_monitor_error(addr, error, now())
    };
    clear_pool(inner, addr, &update);
    apply(inner, &update);
}

/// Clears `addr`'s pool in the data path when `update` says so.
fn clear_pool(inner: &Inner, addr: &HostAddr, update: &Update) {
    if update.clear_pool {
        if let Some(clear) = inner.pool_clearer.get() {
            clear(addr);
        }
    }
}

/// Round trips of a member monitored by streaming: a `ping` every heartbeat on a connection
/// of its own. Members that are polled are timed by their polls, and get no ping.
async fn run_rtt(inner: Arc<Inner>, addr: HostAddr) {
    let target = addr.to_string();
    let timeout = inner.options.connect_timeout;
    let mut conn: Option<ShardConnection> = None;
    loop {
        let (streaming, heartbeat) = {
            let topology = lock(&inner.topology);
            let plan = topology.next_check(&addr, Instant::now());
            let Some(plan) = plan else {
                return;
            };
            (
                matches!(plan.kind, CheckKind::Awaitable { .. }),
                topology.settings().heartbeat(),
            )
        };
        tokio::time::sleep(heartbeat).await;
        if !streaming {
            conn = None;
            continue;
        }
        if conn.is_none() {
            match ShardConnection::connect_with(&target, timeout, &inner.options.security).await {
                Ok(c) => conn = Some(c),
                // The monitor reports reachability; this task only times.
                Err(_) => continue,
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        count(&inner, &addr, |c| c.pings += 1);
        let started = Instant::now();
        match c.run(&doc! {"ping": 1, "$db": "admin"}, timeout).await {
            Ok(_) => {
                let sample = started.elapsed();
                lock(&inner.topology).on_rtt_sample(&addr, sample);
            }
            Err(_) => conn = None,
        }
    }
}
