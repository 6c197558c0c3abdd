//! A deterministic simulation of routers in front of one capacity-limited shard, to show what the
//! adaptive limit is for (docs/design/adaptive-limit.md section 5): with a fixed `max_in_flight`
//! the shard's queue and the latency grow with the number of routers; with the adaptive limit the
//! routers back off together, send fewer, larger batches, and latency stays near the service time
//! while throughput stays near capacity.
//!
//! Model: each router receives single-statement writes at a fixed rate and queues them; when
//! its [`Limiter`] admits a batch it takes up to `max_operations` queued statements. The shard
//! executes at most `capacity` batches at once, each taking `per_batch + per_statement × n`;
//! further batches wait in its FIFO queue. Time is simulated; nothing sleeps.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use super::limiter::{Admission, BatchInfo, Limiter, LimiterSettings, OpKind, Outcome, Ticket};

/// One simulation's parameters.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Routers in front of the shard.
    pub routers: usize,
    /// Statements per second arriving at each router.
    pub rate_per_router: f64,
    /// Batches the shard executes at once.
    pub capacity: usize,
    /// Fixed cost of one batch.
    pub per_batch: Duration,
    /// Cost per statement in a batch.
    pub per_statement: Duration,
    /// Simulated time.
    pub duration: Duration,
    /// The limiter settings of every router (`min_in_flight = max_in_flight` fixes the limit).
    pub limiter: LimiterSettings,
}

/// What a simulation measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    /// Statements completed per second.
    pub throughput: f64,
    /// Median statement latency (arrival to completion).
    pub p50: Duration,
    /// 99th percentile statement latency.
    pub p99: Duration,
    /// Mean number of batches waiting in the shard's queue.
    pub mean_shard_queue: f64,
    /// Mean statements per batch.
    pub mean_batch: f64,
    /// The service time of a batch of that mean size, for comparison.
    pub service_time: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum EventKind {
    /// The shard finished a batch: (router, batch id).
    Done(usize, usize),
    /// A router should try to send.
    Wake(usize),
    /// A statement arrives at a router.
    Arrive(usize),
}

struct Batch {
    router: usize,
    arrivals: Vec<Duration>,
    ticket: Ticket,
}

/// The overload scenario: `routers` routers sharing 24,000 single-statement writes/s in front
/// of a shard with 4 execution slots, 1 ms + 20 µs per statement per batch; `adaptive` false
/// fixes every router's limit at `max_in_flight`.
pub fn overload_config(routers: usize, adaptive: bool, duration: Duration) -> SimConfig {
    let mut limiter = LimiterSettings::default();
    if !adaptive {
        limiter.min_in_flight = limiter.max_in_flight;
    }
    SimConfig {
        routers,
        rate_per_router: 24_000.0 / routers as f64,
        capacity: 4,
        per_batch: Duration::from_millis(1),
        per_statement: Duration::from_micros(20),
        duration,
        limiter,
    }
}

/// Runs one simulation.
pub fn run(cfg: &SimConfig) -> SimResult {
    let start = Duration::from_secs(1_000_000);
    let end = start + cfg.duration;
    let warmup = start + cfg.duration / 5;
    let mut events: BinaryHeap<Reverse<(Duration, u64, EventKind)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |events: &mut BinaryHeap<_>, at: Duration, e: EventKind| {
        seq += 1;
        events.push(Reverse((at, seq, e)));
    };
    let mut limiters: Vec<Limiter> = (0..cfg.routers)
        .map(|_| Limiter::new(cfg.limiter.clone()))
        .collect();
    let mut queues: Vec<VecDeque<Duration>> = vec![VecDeque::new(); cfg.routers];
    let gap = Duration::from_secs_f64(1.0 / cfg.rate_per_router.max(1e-9));
    for r in 0..cfg.routers {
        // Stagger the routers' arrivals.
        let offset = gap.mul_f64(r as f64 / cfg.routers as f64);
        push(&mut events, start + offset, EventKind::Arrive(r));
    }
    let mut batches: Vec<Option<Batch>> = Vec::new();
    // The instant each router last asked to be woken at, until that wake-up happens.
    let mut woken: Vec<Option<Duration>> = vec![None; cfg.routers];
    let mut running = 0usize;
    let mut shard_queue: VecDeque<usize> = VecDeque::new();
    let mut latencies: Vec<Duration> = Vec::new();
    let mut completed = 0u64;
    let mut batch_sizes = 0u64;
    let mut batch_count = 0u64;
    let mut queue_area = 0f64;
    let mut last_t = start;
    let service = |n: usize| cfg.per_batch + cfg.per_statement * n as u32;

    while let Some(Reverse((t, _, ev))) = events.pop() {
        if t > end {
            break;
        }
        if t > warmup {
            queue_area += shard_queue.len() as f64 * (t - last_t.max(warmup)).as_secs_f64();
        }
        last_t = t;
        let router = match ev {
            EventKind::Arrive(r) => {
                queues[r].push_back(t);
                push(&mut events, t + gap, EventKind::Arrive(r));
                r
            }
            EventKind::Done(r, id) => {
                running -= 1;
                if let Some(b) = batches[id].take() {
                    limiters[b.router].on_finish(t, b.ticket, Outcome::Completed);
                    if t > warmup {
                        completed += b.arrivals.len() as u64;
                        latencies.extend(b.arrivals.iter().map(|a| t - *a));
                    }
                }
                if let Some(next) = shard_queue.pop_front() {
                    running += 1;
                    let n = batches[next]
                        .as_ref()
                        .map(|b| b.arrivals.len())
                        .unwrap_or(0);
                    push(
                        &mut events,
                        t + service(n),
                        EventKind::Done(
                            batches[next].as_ref().map(|b| b.router).unwrap_or(0),
                            next,
                        ),
                    );
                }
                // A finished execution may let every router send again.
                for other in 0..cfg.routers {
                    if other != r {
                        push(&mut events, t, EventKind::Wake(other));
                    }
                }
                r
            }
            EventKind::Wake(r) => {
                if woken[r] == Some(t) {
                    woken[r] = None;
                }
                r
            }
        };
        // The router sends as long as its limiter admits batches and it has statements.
        loop {
            if queues[router].is_empty() {
                break;
            }
            let n = queues[router].len().min(cfg.limiter.max_operations);
            let info = BatchInfo {
                op: OpKind::Mutate,
                group: 1,
                operations: n,
                bytes: n * 100,
            };
            match limiters[router].on_start(t, &info) {
                Admission::Start(ticket) => {
                    let arrivals: Vec<Duration> = queues[router].drain(..n).collect();
                    batch_sizes += n as u64;
                    batch_count += 1;
                    let id = batches.len();
                    batches.push(Some(Batch {
                        router,
                        arrivals,
                        ticket,
                    }));
                    if running < cfg.capacity {
                        running += 1;
                        push(&mut events, t + service(n), EventKind::Done(router, id));
                    } else {
                        shard_queue.push_back(id);
                    }
                }
                Admission::Wait(Some(at)) => {
                    // One wake-up per router and instant: a waiting router asks again at every
                    // arrival and every finish, and each answer names the same instant. Pushing
                    // one per answer multiplied them (18 million wake-ups in 30 simulated
                    // seconds at 8 routers, against under a million with this check); the
                    // duplicates changed nothing, since the first of them already asked.
                    let at = at.max(t + Duration::from_micros(1));
                    if woken[router] != Some(at) {
                        woken[router] = Some(at);
                        push(&mut events, at, EventKind::Wake(router));
                    }
                    break;
                }
                Admission::Wait(None) => break,
            }
        }
    }
    latencies.sort_unstable();
    let pct = |p: f64| -> Duration {
        if latencies.is_empty() {
            return Duration::ZERO;
        }
        latencies[((latencies.len() - 1) as f64 * p) as usize]
    };
    let measured = (end - warmup).as_secs_f64();
    let mean_batch = if batch_count > 0 {
        batch_sizes as f64 / batch_count as f64
    } else {
        0.0
    };
    SimResult {
        throughput: completed as f64 / measured,
        p50: pct(0.50),
        p99: pct(0.99),
        mean_shard_queue: queue_area / measured,
        mean_batch,
        service_time: service(mean_batch.round() as usize),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(routers: usize, adaptive: bool) -> SimConfig {
        overload_config(routers, adaptive, Duration::from_secs(10))
    }

    #[test]
    fn adaptive_limit_keeps_the_shard_queue_from_growing_with_routers() {
        let f1 = run(&config(1, false));
        let f8 = run(&config(8, false));
        let a1 = run(&config(1, true));
        let a8 = run(&config(8, true));
        for r in [&f1, &f8, &a1, &a8] {
            assert!(
                r.throughput > 0.95 * 24_000.0,
                "the offered load is served: {r:?}"
            );
        }
        // Fixed limit: the shard's queue and the p99 grow with the number of routers.
        assert!(
            f8.mean_shard_queue > 6.0 * f1.mean_shard_queue,
            "{f1:?} {f8:?}"
        );
        assert!(f8.p99 > f1.p99 * 5, "{f1:?} {f8:?}");
        // Adaptive: a fraction of the fixed limit's queue and p99 at 8 routers.
        assert!(
            a8.mean_shard_queue < f8.mean_shard_queue / 4.0,
            "{a8:?} vs {f8:?}"
        );
        assert!(a8.p99 < f8.p99 / 2, "{a8:?} vs {f8:?}");
        assert!(a8.p99 < a1.p99 * 4, "{a1:?} {a8:?}");
    }

    /// Issue 18's target: routers in front of one shard converge to equal shares of it, so the
    /// p99 at eight routers stays within 1.5 times the p99 of one router. It does not yet: 15.7
    /// against 5.5 ms, 2.85 times (docs/design/adaptive-limit.md section 13, which lists what
    /// was tried). 60 simulated seconds, as the benchmark: the limits may grow only after 12.5 s.
    #[test]
    #[ignore = "not met: the routers' limits do not converge (2.85 times; docs/design/adaptive-limit.md section 13)"]
    fn eight_routers_keep_the_p99_within_one_and_a_half_times_one_routers() {
        let sixty = Duration::from_secs(60);
        let one = run(&overload_config(1, true, sixty));
        let eight = run(&overload_config(8, true, sixty));
        let ratio = eight.p99.as_secs_f64() / one.p99.as_secs_f64();
        assert!(ratio <= 1.5, "{ratio:.2} times: {one:?} {eight:?}");
    }
}
