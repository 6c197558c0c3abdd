//! The adaptive execution limit of one shard (docs/design/adaptive-limit.md), as a sans-IO state
//! machine: `on_start(now, batch)` admits a batch or says how long to wait, `on_finish(now, ticket,
//! outcome)` feeds an execution time back, `next_deadline()` says when waiting work should ask
//! again. The clock is an argument (wall-clock time since the Unix epoch, so that routers probe at
//! the same instants), which makes every rule testable against a simulated shard.
//!
//! Each operation kind (mutations, reads) has its own limit on batches that are not full; both
//! together stay within `max_in_flight`. An execution is compared with the fastest recent execution
//! of the same group and the same or a larger size class (its baseline, never less than
//! [`MIN_BASELINE`], a floor against scheduler jitter); when a window's median exceeds 4× its
//! baseline while batches ran together or one was held back, the limit halves; once settled, while
//! executions stay under 4×, it grows by half a batch per window (by half its value below one).
//! Below one, batches run one at a time with the shard idle in between. Full batches bypass the
//! limit. Probes pause a busy shard at synchronized instants so baselines can be renewed. A shard
//! that answered nothing at all for a while (a stall) is told from a queueing one by the next
//! execution: the stall's slow samples wait for it, and are dropped when it is fast.

use std::collections::HashMap;
use std::time::Duration;

/// Settings (config `[batching]`).
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterSettings {
    /// Simultaneous executions per shard, all kinds together.
    pub max_in_flight: usize,
    /// Lowest adaptive limit; 0 lets it fall to a quarter of a batch.
    pub min_in_flight: usize,
    /// Statements that make a batch full.
    pub max_operations: usize,
    /// Bytes that make a batch full.
    pub max_bytes: usize,
    /// The base probe interval.
    pub probe_interval: Duration,
}

impl Default for LimiterSettings {
    fn default() -> Self {
        LimiterSettings {
            max_in_flight: 16,
            min_in_flight: 0,
            max_operations: 128,
            max_bytes: 4 * 1024 * 1024,
            probe_interval: Duration::from_secs(10),
        }
    }
}

/// The two kinds of work, limited separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Writes.
    Mutate,
    /// Reads.
    Read,
}

impl OpKind {
    /// A label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            OpKind::Mutate => "mutate",
            OpKind::Read => "read",
        }
    }

    fn index(self) -> usize {
        match self {
            OpKind::Mutate => 0,
            OpKind::Read => 1,
        }
    }
}

/// What the limiter needs to know about a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchInfo {
    /// Mutation or read.
    pub op: OpKind,
    /// The group (command and namespace), hashed.
    pub group: u64,
    /// Statements in the batch.
    pub operations: usize,
    /// Bytes in the batch.
    pub bytes: usize,
}

/// An admitted batch; give it back to [`Limiter::on_finish`].
#[derive(Debug, Clone, PartialEq)]
pub struct Ticket {
    op: OpKind,
    group: u64,
    class: u32,
    full: bool,
    probe: bool,
    started: Duration,
}

/// The limiter's answer to a batch that wants to run.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Run it now.
    Start(Ticket),
    /// Ask again at this time, or when an execution finishes (`None`).
    Wait(Option<Duration>),
}

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It completed: the time counts.
    Completed,
    /// It timed out: counts as slow.
    TimedOut,
    /// Its callers all left, it failed before its deadline, or it was cancelled: not a sample.
    NotCounted,
}

#[derive(Debug, Clone, Copy)]
struct Baseline {
    value: Duration,
    raised_at: Duration,
}

#[derive(Debug, Default, Clone)]
struct Window {
    started: Option<Duration>,
    ratios: Vec<f64>,
    contention: bool,
    held_back: bool,
}

/// A sample that waits for the verdict on a silence (see [`Limiter::judge`]).
#[derive(Debug, Clone)]
struct Sample {
    op: OpKind,
    ratio: f64,
    /// The execution time, for `typical` (a timeout has none).
    took: Option<Duration>,
}

/// What the executions after a silence said about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// No execution that started after it has finished yet: its samples are held.
    Pending,
    /// The next execution was answered quickly: the shard was unreachable, not queueing; the
    /// executions that spanned the silence are not samples.
    Stall,
    /// The next execution was slow too: the silence was queueing; its samples count.
    Load,
}

/// The latest time the shard answered nothing while executions ran, long enough to make one
/// of them slow.
#[derive(Debug, Clone, Copy)]
struct Silence {
    /// When it ended: the first answer after it.
    to: Duration,
    /// How long the shard had been silent.
    length: Duration,
    verdict: Verdict,
}

/// Where a finished execution's sample goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    Counted,
    Held,
    Dropped,
}

#[derive(Debug, Clone)]
struct OpState {
    limit: f64,
    in_flight_limited: usize,
    in_flight: usize,
    first_execution: Option<Duration>,
    typical: Option<Duration>,
    last_start: Option<Duration>,
    idle_until: Duration,
    window: Window,
    last_ratio: f64,
    probe_due: bool,
    busy_since_probe: bool,
    /// Windows closed so far (for tests and diagnostics).
    windows: u64,
}

/// The limiter of one shard.
#[derive(Debug, Clone)]
pub struct Limiter {
    settings: LimiterSettings,
    ops: [OpState; 2],
    baselines: HashMap<(OpKind, u64, u32), Baseline>,
    next_probe: Option<Duration>,
    pause_until: Duration,
    /// When the shard last completed an execution of either kind.
    last_answer: Option<Duration>,
    /// The latest silence, with its verdict.
    silence: Option<Silence>,
    /// Samples of the executions a pending silence spanned.
    held: Vec<Sample>,
}

/// Ratio of execution time to baseline above which the shard is considered queueing.
pub const SLOW_RATIO: f64 = 4.0;
const MIN_WINDOW: Duration = Duration::from_millis(10);
const MIN_WINDOW_SAMPLES: usize = 8;
const MAX_IDLE: Duration = Duration::from_secs(1);
/// The smallest baseline an execution is compared with. Below half a millisecond the spread of
/// execution times is the schedulers' (router, network stack, shard), not a queue's: on a busy
/// host a 100 µs round trip swings past four times itself with no shard queue at all, and a
/// limit that halved on that would idle a fast shard between batches. Queueing that costs a
/// client anything shows up as milliseconds, which still reads as slow against this floor.
pub const MIN_BASELINE: Duration = Duration::from_micros(500);

fn size_class(operations: usize) -> u32 {
    usize::BITS - operations.max(1).leading_zeros()
}

impl Limiter {
    /// A limiter with these settings; each limit starts at two batches (or `min_in_flight`).
    pub fn new(settings: LimiterSettings) -> Limiter {
        let start =
            (settings.min_in_flight.max(2) as f64).min(settings.max_in_flight.max(1) as f64);
        let op = OpState {
            limit: start,
            in_flight_limited: 0,
            in_flight: 0,
            first_execution: None,
            typical: None,
            last_start: None,
            idle_until: Duration::ZERO,
            window: Window::default(),
            last_ratio: 0.0,
            probe_due: false,
            busy_since_probe: false,
            windows: 0,
        };
        Limiter {
            settings,
            ops: [op.clone(), op],
            baselines: HashMap::new(),
            next_probe: None,
            pause_until: Duration::ZERO,
            last_answer: None,
            silence: None,
            held: Vec::new(),
        }
    }

    /// The current limit of `op` (batches that are not full).
    pub fn limit(&self, op: OpKind) -> f64 {
        self.ops[op.index()].limit
    }

    /// The last window's median ratio of execution time to baseline.
    pub fn latency_ratio(&self, op: OpKind) -> f64 {
        self.ops[op.index()].last_ratio
    }

    /// Executions of `op` running now.
    pub fn in_flight(&self, op: OpKind) -> usize {
        self.ops[op.index()].in_flight
    }

    fn floor(&self) -> f64 {
        if self.settings.min_in_flight > 0 {
            self.settings.min_in_flight as f64
        } else {
            0.25
        }
    }

    fn is_full(&self, b: &BatchInfo) -> bool {
        b.operations >= self.settings.max_operations || b.bytes >= self.settings.max_bytes
    }

    fn typical(&self) -> Duration {
        self.ops
            .iter()
            .filter_map(|o| o.typical)
            .max()
            .unwrap_or(Duration::from_millis(1))
    }

    /// The probe interval: the base interval doubled until the pause is at most 2.5% of it.
    pub fn probe_interval(&self) -> Duration {
        let pause = self.probe_pause();
        let mut i = self.settings.probe_interval;
        while pause.as_secs_f64() > 0.025 * i.as_secs_f64() && i < Duration::from_secs(3600) {
            i *= 2;
        }
        i
    }

    fn probe_pause(&self) -> Duration {
        (self.typical() * 2).clamp(Duration::from_millis(20), Duration::from_secs(1))
    }

    /// Whether `op`'s limit may grow: 1.25 probe intervals after its first execution.
    fn settled(&self, op: OpKind, now: Duration) -> bool {
        match self.ops[op.index()].first_execution {
            Some(first) => now >= first + self.probe_interval().mul_f64(1.25),
            None => false,
        }
    }

    /// The next synchronized probe instant after `now`: a multiple of the interval in wall
    /// time; the first one is the next multiple of the base interval.
    fn probe_instant_after(interval: Duration, now: Duration) -> Duration {
        let i = interval.as_nanos().max(1);
        let n = now.as_nanos() / i + 1;
        Duration::from_nanos((n * i) as u64)
    }

    /// Asks whether `batch` may start at `now`.
    pub fn on_start(&mut self, now: Duration, batch: &BatchInfo) -> Admission {
        // Synchronized probes: a shard that was busy pauses, then sends one batch of each kind.
        let next_probe = *self
            .next_probe
            .get_or_insert_with(|| Self::probe_instant_after(self.settings.probe_interval, now));
        if now >= next_probe {
            let busy = self.ops.iter().any(|o| o.busy_since_probe);
            self.next_probe = Some(Self::probe_instant_after(self.probe_interval(), now));
            if busy {
                self.pause_until = now + self.probe_pause();
                for o in &mut self.ops {
                    o.busy_since_probe = false;
                    o.probe_due = true;
                }
            }
        }
        if now < self.pause_until {
            self.ops[batch.op.index()].window.held_back = true;
            return Admission::Wait(Some(self.pause_until));
        }
        let total: usize = self.ops.iter().map(|o| o.in_flight).sum();
        if total >= self.settings.max_in_flight {
            self.ops[batch.op.index()].window.held_back = true;
            self.ops[batch.op.index()].busy_since_probe = true;
            return Admission::Wait(None);
        }
        let full = self.is_full(batch);
        let st = &self.ops[batch.op.index()];
        let probe = st.probe_due && st.in_flight == 0;
        if !full && !probe {
            let limit = st.limit;
            if limit >= 1.0 {
                let allowed = limit.floor() as usize;
                if st.in_flight_limited >= allowed {
                    // Anti-stall: one more batch once 4 typical executions (at most a second)
                    // passed since the previous start; each further one waits that much longer.
                    let gap = (st.typical.unwrap_or(Duration::from_millis(1)) * 4).min(MAX_IDLE);
                    let over = (st.in_flight_limited + 1 - allowed) as u32;
                    let at = st.last_start.unwrap_or(now) + gap * over;
                    if now < at {
                        let o = &mut self.ops[batch.op.index()];
                        o.window.held_back = true;
                        o.busy_since_probe = true;
                        return Admission::Wait(Some(at));
                    }
                }
            } else if st.in_flight_limited > 0 || now < st.idle_until {
                let at = if st.in_flight_limited > 0 {
                    None
                } else {
                    Some(st.idle_until)
                };
                let o = &mut self.ops[batch.op.index()];
                o.window.held_back = true;
                o.busy_since_probe = true;
                return Admission::Wait(at);
            }
        }
        let o = &mut self.ops[batch.op.index()];
        o.in_flight += 1;
        if !full {
            o.in_flight_limited += 1;
        }
        if o.in_flight > 1 {
            o.window.contention = true;
            o.busy_since_probe = true;
        }
        if probe {
            o.probe_due = false;
        }
        o.last_start = Some(now);
        o.first_execution.get_or_insert(now);
        Admission::Start(Ticket {
            op: batch.op,
            group: batch.group,
            class: size_class(batch.operations),
            full,
            probe,
            started: now,
        })
    }

    /// The baseline for a batch: the fastest recent execution of its group in the same or a
    /// larger size class.
    fn baseline(&self, op: OpKind, group: u64, class: u32) -> Option<Duration> {
        self.baselines
            .iter()
            .filter(|((o, g, c), _)| *o == op && *g == group && *c >= class)
            .map(|(_, b)| b.value)
            .min()
    }

    /// Records the end of an execution.
    pub fn on_finish(&mut self, now: Duration, ticket: Ticket, outcome: Outcome) {
        let idx = ticket.op.index();
        {
            let o = &mut self.ops[idx];
            o.in_flight = o.in_flight.saturating_sub(1);
            if !ticket.full {
                o.in_flight_limited = o.in_flight_limited.saturating_sub(1);
            }
        }
        if outcome == Outcome::NotCounted {
            return;
        }
        let took = now
            .saturating_sub(ticket.started)
            .max(Duration::from_micros(1));
        let base = self.baseline(ticket.op, ticket.group, ticket.class);
        let ratio = match (outcome, base) {
            (Outcome::TimedOut, _) => f64::INFINITY,
            (_, Some(b)) => took.as_secs_f64() / b.max(MIN_BASELINE).as_secs_f64(),
            (_, None) => 1.0,
        };
        let sample = Sample {
            op: ticket.op,
            ratio,
            took: (outcome == Outcome::Completed).then_some(took),
        };
        if outcome == Outcome::Completed {
            // Only a baseline can be lowered by any sample; probes may raise it, at most
            // twofold per interval (or per 15 s, whichever is longer).
            let rise_every = self.probe_interval().max(Duration::from_secs(15));
            let key = (ticket.op, ticket.group, ticket.class);
            match self.baselines.get_mut(&key) {
                Some(b) if took < b.value => {
                    b.value = took;
                }
                Some(b) if ticket.probe && now >= b.raised_at + rise_every => {
                    b.value = took.min(b.value * 2);
                    b.raised_at = now;
                }
                Some(_) => {}
                None => {
                    self.baselines.insert(
                        key,
                        Baseline {
                            value: took,
                            raised_at: now,
                        },
                    );
                }
            }
            let judged = self.judge(now, ticket.started, took, base, ratio);
            self.last_answer = Some(self.last_answer.map_or(now, |a| a.max(now)));
            match judged {
                Judged::Counted => self.record(now, sample),
                Judged::Held => self.held.push(sample),
                Judged::Dropped => {}
            }
        } else {
            // A timeout is no answer: it neither ends a silence nor waits for a verdict.
            self.record(now, sample);
        }
        let o = &mut self.ops[idx];
        if o.limit < 1.0 {
            // Below one: the shard stays idle between batches, as long as an execution takes
            // at a half, at most a second.
            let typical = o.typical.unwrap_or(took);
            let idle = typical.mul_f64(1.0 / o.limit - 1.0).min(MAX_IDLE);
            o.idle_until = now + idle;
        }
    }

    /// Tells a stalled shard from an overloaded one for a completed execution that started at
    /// `started` and took `took` (section 12 of the design).
    ///
    /// A *silence* is a time in which executions ran and the shard answered none of them. An
    /// execution is slow because of a silence when it is slow and the shard's last answer came
    /// within four baselines of its start (or before it): the silence then ends with this
    /// execution, and its sample and those of every execution running at that moment are held.
    /// The first execution that starts after the silence ended gives the verdict:
    ///
    /// - answered at its usual speed (at most four times its baseline), or in at most a quarter
    ///   of the silence, it says the shard was unreachable (stopped, paused, partitioned), not
    ///   queueing: the held samples, and those of executions that were running when the silence
    ///   ended and finish later, are dropped; they move neither the limit nor `typical`;
    /// - slow too, it says the shard is queueing: the held samples are counted, in order.
    ///
    /// Executions started together against a queueing shard look like a silence as well, so
    /// under load a round of samples waits for the next round before it counts; the limit still
    /// halves, one round later.
    fn judge(
        &mut self,
        now: Duration,
        started: Duration,
        took: Duration,
        base: Option<Duration>,
        ratio: f64,
    ) -> Judged {
        if let Some(s) = self.silence.as_mut() {
            if s.verdict == Verdict::Pending && started >= s.to {
                let quick = ratio <= SLOW_RATIO || took.mul_f64(SLOW_RATIO) <= s.length;
                if quick {
                    s.verdict = Verdict::Stall;
                    self.held.clear();
                } else {
                    s.verdict = Verdict::Load;
                    for held in std::mem::take(&mut self.held) {
                        self.record(now, held);
                    }
                }
            }
        }
        if let Some(s) = self.silence {
            if started < s.to {
                // It was running when the silence ended: it shares its verdict.
                return match s.verdict {
                    Verdict::Pending => Judged::Held,
                    Verdict::Stall => Judged::Dropped,
                    Verdict::Load => Judged::Counted,
                };
            }
        }
        let Some(base) = base else {
            return Judged::Counted;
        };
        let quiet_from = self.last_answer.map_or(started, |a| a.max(started));
        let silent = now.saturating_sub(quiet_from);
        let explained = took.saturating_sub(silent) <= base.max(MIN_BASELINE).mul_f64(SLOW_RATIO);
        if ratio > SLOW_RATIO && explained {
            self.silence = Some(Silence {
                to: now,
                length: silent,
                verdict: Verdict::Pending,
            });
            return Judged::Held;
        }
        Judged::Counted
    }

    /// Adds a sample to its kind's window (and its time to `typical`), closing the window and
    /// moving the limit when it is complete.
    fn record(&mut self, now: Duration, sample: Sample) {
        let settled = self.settled(sample.op, now);
        let floor = self.floor();
        let max = self.settings.max_in_flight as f64;
        let o = &mut self.ops[sample.op.index()];
        if let Some(took) = sample.took {
            o.typical = Some(match o.typical {
                Some(t) => t.mul_f64(0.8) + took.mul_f64(0.2),
                None => took,
            });
        }
        let window_len = MIN_WINDOW.max(o.typical.unwrap_or(Duration::ZERO));
        let started = *o.window.started.get_or_insert(now);
        o.window.ratios.push(sample.ratio);
        if o.window.ratios.len() >= MIN_WINDOW_SAMPLES && now >= started + window_len {
            let mut r = std::mem::take(&mut o.window.ratios);
            r.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            let median = r[r.len() / 2];
            o.last_ratio = median;
            if median > SLOW_RATIO && (o.window.contention || o.window.held_back) {
                o.limit = (o.limit / 2.0).max(floor);
            } else if median <= SLOW_RATIO && settled {
                o.limit = if o.limit >= 1.0 {
                    o.limit + 0.5
                } else {
                    o.limit * 1.5
                };
                o.limit = o.limit.min(max);
            }
            o.window = Window::default();
            o.windows += 1;
        }
    }

    /// When waiting work should ask again at the latest (besides when an execution ends).
    pub fn next_deadline(&self) -> Option<Duration> {
        let mut d: Option<Duration> =
            (self.pause_until > Duration::ZERO).then_some(self.pause_until);
        for o in &self.ops {
            if o.limit < 1.0 && o.idle_until > Duration::ZERO {
                d = Some(d.map_or(o.idle_until, |x| x.min(o.idle_until)));
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn batch(op: OpKind, ops: usize) -> BatchInfo {
        BatchInfo {
            op,
            group: 1,
            operations: ops,
            bytes: ops * 100,
        }
    }

    fn settings() -> LimiterSettings {
        LimiterSettings::default()
    }

    fn start(l: &mut Limiter, now: Duration, b: &BatchInfo) -> Ticket {
        match l.on_start(now, b) {
            Admission::Start(t) => t,
            other => panic!("expected a start at {now:?}, got {other:?}"),
        }
    }

    /// Runs rounds of up to `per` concurrent executions of `took` each (with `outcome`) until
    /// `n` windows of mutations have closed; time advances to the limiter's deadlines when it
    /// holds everything back.
    fn run_windows_with(
        l: &mut Limiter,
        t: &mut Duration,
        n: usize,
        per: usize,
        took: Duration,
        outcome: Outcome,
    ) {
        let mut closed = 0;
        let mut guard = 0;
        while closed < n {
            guard += 1;
            assert!(guard < 10_000, "windows never close");
            let mut tickets = Vec::new();
            let mut wait = None;
            for _ in 0..per {
                match l.on_start(*t, &batch(OpKind::Mutate, 10)) {
                    Admission::Start(tk) => tickets.push(tk),
                    Admission::Wait(w) => wait = w,
                }
            }
            if tickets.is_empty() {
                *t = wait.filter(|w| *w > *t).unwrap_or(*t + MS);
                continue;
            }
            *t += took;
            for tk in tickets {
                let before = l.ops[0].windows;
                l.on_finish(*t, tk, outcome);
                closed += (l.ops[0].windows - before) as usize;
            }
            *t += MS * 2;
        }
    }

    fn run_windows(l: &mut Limiter, t: &mut Duration, n: usize, per: usize, took: Duration) {
        run_windows_with(l, t, n, per, took, Outcome::Completed)
    }

    /// A shard that answers nothing for `stall` while work keeps arriving: a batch is offered
    /// every millisecond and the limiter admits what it admits (the anti-stall rule lets some
    /// through). Returns the executions admitted, none of them finished.
    fn stalled(l: &mut Limiter, t: &mut Duration, stall: Duration) -> Vec<Ticket> {
        let b = batch(OpKind::Mutate, 10);
        let end = *t + stall;
        let mut running = Vec::new();
        while *t < end {
            match l.on_start(*t, &b) {
                Admission::Start(tk) => running.push(tk),
                Admission::Wait(_) => *t += MS,
            }
        }
        running
    }

    /// The shard resumes and answers `running` one after another, 100 µs apart.
    fn resume(l: &mut Limiter, t: &mut Duration, running: Vec<Ticket>) {
        for tk in running {
            *t += Duration::from_micros(100);
            l.on_finish(*t, tk, Outcome::Completed);
        }
    }

    fn typical(l: &Limiter) -> Duration {
        l.ops[OpKind::Mutate.index()].typical.unwrap_or_default()
    }

    #[test]
    fn a_stalled_shard_is_not_read_as_an_overloaded_one() {
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        run_windows(&mut l, &mut t, 2, 2, MS);
        assert_eq!(l.limit(OpKind::Mutate), 2.0);
        let before = typical(&l);
        // Nothing answered for 2.5 s (as under SIGSTOP), work piling up behind it.
        let mut running = stalled(&mut l, &mut t, Duration::from_millis(2_500));
        assert!(
            running.len() >= 4,
            "batches ran together and were held back: {}",
            running.len()
        );
        // It resumes: all but one answer at once, each after up to 2.5 s.
        let last = running.pop().expect("one left");
        resume(&mut l, &mut t, running);
        assert_eq!(
            l.limit(OpKind::Mutate),
            2.0,
            "the stall did not halve the limit"
        );
        assert_eq!(typical(&l), before, "held samples do not move typical");
        // Fast executions follow: the silence was a stall; its samples are dropped.
        let b = batch(OpKind::Mutate, 10);
        let a = start(&mut l, t, &b);
        t += MS;
        l.on_finish(t, a, Outcome::Completed);
        // An execution that spanned the stall and answers late is no sample either.
        t += MS;
        l.on_finish(t, last, Outcome::Completed);
        run_windows(&mut l, &mut t, 3, 2, MS);
        assert_eq!(l.limit(OpKind::Mutate), 2.0, "the limit did not move");
        assert!(l.latency_ratio(OpKind::Mutate) <= SLOW_RATIO);
        assert!(
            typical(&l) <= MS * 2,
            "typical stays an execution's time: {:?}",
            typical(&l)
        );
        // No idle gap or anti-stall wait: two batches start at once, as before the stall.
        assert_eq!(l.next_deadline(), None);
        start(&mut l, t, &b);
        start(&mut l, t, &b);
    }

    #[test]
    fn a_silence_followed_by_slow_executions_is_load_and_halves() {
        // The same stall, but the shard stays slow afterwards: it is queueing, and the held
        // samples count.
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        run_windows(&mut l, &mut t, 2, 2, MS);
        let running = stalled(&mut l, &mut t, Duration::from_millis(2_500));
        resume(&mut l, &mut t, running);
        run_windows(&mut l, &mut t, 1, 2, Duration::from_millis(2_500));
        assert!(l.limit(OpKind::Mutate) <= 1.0, "halved");
        assert!(l.latency_ratio(OpKind::Mutate) > SLOW_RATIO);
        assert!(
            typical(&l) > Duration::from_millis(100),
            "{:?}",
            typical(&l)
        );
        // A sudden overload without a stall before it: executions two at a time go from 1 ms
        // to 2.5 s and stay there; every round is a silence, and each next round says load.
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        run_windows(&mut l, &mut t, 2, 2, MS);
        run_windows(&mut l, &mut t, 1, 2, Duration::from_millis(2_500));
        assert_eq!(l.limit(OpKind::Mutate), 1.0, "2 → 1");
        run_windows(&mut l, &mut t, 1, 2, Duration::from_millis(2_500));
        assert_eq!(l.limit(OpKind::Mutate), 0.5, "1 → 0.5 with work held back");
    }

    #[test]
    fn a_lone_slow_execution_waits_for_the_next_one() {
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        run_windows(&mut l, &mut t, 1, 1, MS);
        let before = typical(&l);
        let b = batch(OpKind::Mutate, 10);
        let slow = start(&mut l, t, &b);
        t += MS * 300;
        l.on_finish(t, slow, Outcome::Completed);
        assert_eq!(
            typical(&l),
            before,
            "held until an execution started after it ends"
        );
        // The next one is slow too (two thirds of it): the held sample counts, then this
        // one waits in turn.
        let next = start(&mut l, t, &b);
        t += MS * 200;
        l.on_finish(t, next, Outcome::Completed);
        assert!(typical(&l) > MS * 50, "{:?}", typical(&l));
        let counted = typical(&l);
        // A fast one after it: the 200 ms execution was a stall and is dropped.
        let fast = start(&mut l, t, &b);
        t += MS;
        l.on_finish(t, fast, Outcome::Completed);
        assert!(typical(&l) < counted);
        assert_eq!(typical(&l), counted.mul_f64(0.8) + MS.mul_f64(0.2));
    }

    /// What another shard's stall does to this shard's load: while the other one answers
    /// nothing, only the writes that target this shard alone arrive (one at a time here);
    /// when it resumes, the bulks that spanned both send their children here all at once.
    /// This shard's executions keep their time throughout, so its limit must not fall: only
    /// its own executions' times move it, never how its work arrives (section 12a).
    #[test]
    fn another_shards_stall_leaves_this_limit_alone() {
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        let b = batch(OpKind::Mutate, 10);
        // Under load, settled and grown past its start.
        run_windows(&mut l, &mut t, 3, 2, MS);
        t += Duration::from_secs(13);
        run_windows(&mut l, &mut t, 2, 2, MS);
        let before = l.limit(OpKind::Mutate);
        assert_eq!(before, 3.0);
        let mut lowest = before;
        // The other shard stalls for 10 s: lone writes, 1 ms each, 1 ms apart.
        let resumed = t + Duration::from_secs(10);
        while t < resumed {
            // (A probe instant may pause the shard for a moment.)
            let a = match l.on_start(t, &b) {
                Admission::Start(a) => a,
                Admission::Wait(w) => {
                    t = w.filter(|w| *w > t).unwrap_or(t + MS);
                    continue;
                }
            };
            t += MS;
            l.on_finish(t, a, Outcome::Completed);
            lowest = lowest.min(l.limit(OpKind::Mutate));
            t += MS;
        }
        // It resumes: 24 children of the bulks that waited arrive together, on top of the
        // lone writes; the limit holds most of them back, each runs in 1 ms.
        let mut pending = 24;
        let mut guard = 0;
        while pending > 0 {
            guard += 1;
            assert!(guard < 10_000, "the burst never drains");
            let mut running = Vec::new();
            let mut wait = None;
            for _ in 0..pending {
                match l.on_start(t, &b) {
                    Admission::Start(tk) => running.push(tk),
                    Admission::Wait(w) => wait = w,
                }
            }
            if running.is_empty() {
                t = wait.filter(|w| *w > t).unwrap_or(t + MS);
                continue;
            }
            pending -= running.len();
            t += MS;
            for tk in running {
                l.on_finish(t, tk, Outcome::Completed);
                lowest = lowest.min(l.limit(OpKind::Mutate));
            }
        }
        run_windows(&mut l, &mut t, 3, 2, MS);
        lowest = lowest.min(l.limit(OpKind::Mutate));
        assert!(
            lowest >= before,
            "the limit fell from {before} to {lowest} without a slow execution"
        );
        assert!(l.latency_ratio(OpKind::Mutate) <= SLOW_RATIO);
        assert!(typical(&l) <= MS * 2, "{:?}", typical(&l));
        assert!(
            l.silence.is_none(),
            "no silence: this shard always answered"
        );
    }

    #[test]
    fn starts_at_two_batches_and_holds_back_a_third() {
        let mut l = Limiter::new(settings());
        let t0 = Duration::from_secs(1000);
        assert_eq!(l.limit(OpKind::Mutate), 2.0);
        let b = batch(OpKind::Mutate, 10);
        let _a = start(&mut l, t0, &b);
        let _b = start(&mut l, t0, &b);
        assert!(matches!(l.on_start(t0, &b), Admission::Wait(_)));
        // Reads have their own limit.
        let _r = start(&mut l, t0, &batch(OpKind::Read, 10));
    }

    #[test]
    fn full_batches_bypass_the_limit_up_to_max_in_flight() {
        let mut l = Limiter::new(settings());
        let t0 = Duration::from_secs(1000);
        let full = batch(OpKind::Mutate, 128);
        let mut tickets = Vec::new();
        for _ in 0..16 {
            tickets.push(start(&mut l, t0, &full));
        }
        assert_eq!(
            l.on_start(t0, &full),
            Admission::Wait(None),
            "max_in_flight bounds everything"
        );
        l.on_finish(t0 + MS, tickets.pop().unwrap(), Outcome::Completed);
        start(&mut l, t0 + MS, &full);
    }

    #[test]
    fn halves_when_executions_queue_under_contention() {
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        // Establish a 1 ms baseline, then run two at a time at 10 ms: queueing.
        run_windows(&mut l, &mut t, 1, 1, MS);
        run_windows(&mut l, &mut t, 1, 2, MS * 10);
        assert_eq!(l.limit(OpKind::Mutate), 1.0, "2 → 1");
        assert!(l.latency_ratio(OpKind::Mutate) > SLOW_RATIO);
        // Slow executions without contention (one at a time, nothing held back) do not halve:
        // the limit cannot tell a shard that slowed down from one that queues.
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        run_windows(&mut l, &mut t, 1, 1, MS);
        run_windows(&mut l, &mut t, 3, 1, MS * 10);
        assert_eq!(l.limit(OpKind::Mutate), 2.0);
        assert!(l.latency_ratio(OpKind::Mutate) > SLOW_RATIO);
    }

    #[test]
    fn sub_millisecond_jitter_is_not_queueing() {
        // A 50 µs baseline, then two at a time at 400 µs (8× the baseline, but under four
        // times the floor): scheduler noise on a fast shard, not a queue.
        let us = Duration::from_micros(1);
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        run_windows(&mut l, &mut t, 1, 1, us * 50);
        run_windows(&mut l, &mut t, 3, 2, us * 400);
        assert_eq!(l.limit(OpKind::Mutate), 2.0);
        // Real queueing on the same fast shard (3 ms) still halves.
        run_windows(&mut l, &mut t, 1, 2, MS * 3);
        assert_eq!(l.limit(OpKind::Mutate), 1.0);
    }

    #[test]
    fn grows_by_half_a_batch_per_window_once_settled() {
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        run_windows(&mut l, &mut t, 3, 2, MS);
        assert_eq!(l.limit(OpKind::Mutate), 2.0, "not settled: no growth");
        t += Duration::from_secs(13); // 1.25 × 10 s after the first execution
        run_windows(&mut l, &mut t, 1, 2, MS);
        assert_eq!(l.limit(OpKind::Mutate), 2.5);
        run_windows(&mut l, &mut t, 1, 2, MS);
        assert_eq!(l.limit(OpKind::Mutate), 3.0);
    }

    #[test]
    fn below_one_the_shard_idles_between_batches() {
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        run_windows(&mut l, &mut t, 1, 1, MS);
        // Queue hard: three halvings take 2 → 1 → 0.5 → 0.25.
        for _ in 0..3 {
            run_windows(&mut l, &mut t, 1, 2, MS * 20);
        }
        assert_eq!(
            l.limit(OpKind::Mutate),
            0.25,
            "floor of a quarter batch when min_in_flight = 0"
        );
        let b = batch(OpKind::Mutate, 10);
        t = t.max(l.next_deadline().unwrap_or(t));
        let tk = start(&mut l, t, &b);
        assert!(
            matches!(l.on_start(t, &b), Admission::Wait(None)),
            "one at a time"
        );
        t += MS * 4;
        l.on_finish(t, tk, Outcome::Completed);
        // At a quarter, the shard stays idle three typical executions (capped at 1 s).
        let Admission::Wait(Some(until)) = l.on_start(t, &b) else {
            panic!("must wait")
        };
        assert!(until > t);
        assert_eq!(l.next_deadline(), Some(until));
        start(&mut l, until, &b);
    }

    #[test]
    fn min_in_flight_equal_to_max_fixes_the_limit() {
        let mut s = settings();
        s.min_in_flight = 16;
        let mut l = Limiter::new(s);
        let mut t = Duration::from_secs(1000);
        assert_eq!(l.limit(OpKind::Mutate), 16.0);
        run_windows(&mut l, &mut t, 1, 1, MS);
        run_windows(&mut l, &mut t, 2, 8, MS * 50);
        assert_eq!(l.limit(OpKind::Mutate), 16.0);
    }

    #[test]
    fn samples_that_do_not_count_are_ignored() {
        let mut l = Limiter::new(settings());
        let mut t = Duration::from_secs(1000);
        run_windows(&mut l, &mut t, 1, 1, MS);
        for _ in 0..20 {
            let a = start(&mut l, t, &batch(OpKind::Mutate, 10));
            let b = start(&mut l, t, &batch(OpKind::Mutate, 10));
            t += MS * 50;
            l.on_finish(t, a, Outcome::NotCounted);
            l.on_finish(t, b, Outcome::NotCounted);
        }
        assert_eq!(l.limit(OpKind::Mutate), 2.0);
        assert!(l.ops[0].window.ratios.is_empty(), "no sample was recorded");
        // Timeouts count as slow.
        run_windows_with(&mut l, &mut t, 1, 2, MS * 2, Outcome::TimedOut);
        assert_eq!(l.limit(OpKind::Mutate), 1.0);
    }

    #[test]
    fn baselines_are_per_group_and_size_class() {
        let mut l = Limiter::new(settings());
        let t = Duration::from_secs(1000);
        let big = BatchInfo {
            op: OpKind::Mutate,
            group: 7,
            operations: 100,
            bytes: 100,
        };
        let tk = start(&mut l, t, &big);
        l.on_finish(t + MS * 5, tk, Outcome::Completed);
        // A smaller batch of the same group compares with the larger one's time.
        assert_eq!(l.baseline(OpKind::Mutate, 7, size_class(10)), Some(MS * 5));
        // A larger class has no baseline yet; another group neither.
        assert_eq!(l.baseline(OpKind::Mutate, 7, size_class(127) + 1), None);
        assert_eq!(l.baseline(OpKind::Mutate, 8, size_class(10)), None);
    }

    #[test]
    fn busy_shards_pause_at_synchronized_probe_instants() {
        let mut a = Limiter::new(settings());
        let mut b = Limiter::new(settings());
        let mut t = Duration::from_millis(995_500);
        // Both routers keep the shard busy through 1000 s, a multiple of 10 s.
        for l in [&mut a, &mut b] {
            let mut tt = t;
            run_windows(l, &mut tt, 1, 2, MS);
        }
        t = Duration::from_secs(1000) + MS;
        let x = batch(OpKind::Mutate, 10);
        let wa = a.on_start(t, &x);
        let wb = b.on_start(t, &x);
        assert_eq!(wa, wb, "both routers pause until the same instant");
        let Admission::Wait(Some(until)) = wa else {
            panic!("paused: {wa:?}")
        };
        assert!(until >= t + MS * 20 && until <= t + Duration::from_secs(1));
        // After the pause one probe batch runs alone.
        let tk = start(&mut a, until, &x);
        assert!(tk.probe);
    }

    #[test]
    fn probes_may_raise_a_baseline_at_most_twofold() {
        let mut l = Limiter::new(settings());
        let t = Duration::from_secs(1000);
        let x = batch(OpKind::Mutate, 10);
        let tk = start(&mut l, t, &x);
        l.on_finish(t + MS, tk, Outcome::Completed);
        let mut probe = start(&mut l, t + Duration::from_secs(30), &x);
        probe.probe = true;
        l.on_finish(
            t + Duration::from_secs(30) + MS * 10,
            probe,
            Outcome::Completed,
        );
        assert_eq!(l.baseline(OpKind::Mutate, 1, size_class(10)), Some(MS * 2));
    }

    #[test]
    fn probe_interval_doubles_for_slow_executions() {
        let mut l = Limiter::new(settings());
        assert_eq!(l.probe_interval(), Duration::from_secs(10));
        let t = Duration::from_secs(1000);
        let x = batch(OpKind::Mutate, 10);
        let tk = start(&mut l, t, &x);
        l.on_finish(t + Duration::from_millis(300), tk, Outcome::Completed);
        // A 600 ms pause needs an interval of at least 24 s: 40 s.
        assert_eq!(l.probe_interval(), Duration::from_secs(40));
    }
}
