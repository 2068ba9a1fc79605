//! The watchdog thread: reports faults that wait too long, keeps idle links alive, follows the
//! control plane's rate limits, and notices a program outrunning its bricks.

use crate::inner::Inner;
use crate::{handler, outrun, placement};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) fn run(inner: Arc<Inner>) {
    let limit = inner.cfg.watchdog.as_nanos() as u64;
    let mut reported = 0u64;
    let mut last_rates = Instant::now();
    let mut outrun = outrun::Monitor::default();
    let mut last_keepalive = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(250));
        // The local memory the program really holds, for --stats (a read of /proc per tick).
        let rss = inner.stats.sample_rss_anon_now();
        if let (Some(run), Some(rss)) = (&inner.run, rss) {
            run.note_rss_anon(rss);
        }
        placement::watch(inner.stats.faults.load(Ordering::Relaxed));
        // Both take the pager core's lock: not while a fork is prepared (the child would
        // inherit it held by a thread it does not have, and wait on it for ever).
        if let Some(_in) = crate::process::CallGuard::try_enter() {
            handler::ask_give_back_if_over(&inner);
            crate::fork_hot::take_back(&inner);
        }
        outrun.tick(&inner);
        if !inner.cfg.keepalive.is_zero()
            && last_keepalive.elapsed() >= (inner.cfg.keepalive / 2).min(Duration::from_secs(1))
        {
            last_keepalive = Instant::now();
            // A link idle for the keep-alive interval gets a PING, so its brick's idle timeout
            // never cuts a program that merely has not faulted for a while. A failed ping
            // breaks the link, as the next fault would have found anyway.
            for s in inner.table.all().iter() {
                let _ = s.fault.keep_alive(inner.cfg.keepalive);
                if let Some(w) = s.writeback.made() {
                    let _ = w.keep_alive(inner.cfg.keepalive);
                }
            }
        }
        if let Some(agent) = inner.agent.as_ref() {
            if last_rates.elapsed() >= Duration::from_secs(1) {
                last_rates = Instant::now();
                // The figures while it runs, for the agent's metrics and the dashboard. An agent
                // too old to know `report` refuses it; the program goes on all the same.
                let _ = agent.report(crate::report::report(&inner));
                // Rate limits change as other allocations come and go: follow them.
                if !inner.table.is_empty() {
                    if let Ok(rates) = agent.rates() {
                        for s in inner.table.all() {
                            if let Some(r) = rates.iter().find(|r| r.segment_id == s.grant.segment_id) {
                                s.limiter.set_rate(r.rate_limit_bps);
                            }
                        }
                    }
                }
            }
        }
        // The longest-waiting fault of any handler.
        let Some((started, addr)) = inner
            .fault_started_ns
            .iter()
            .zip(inner.fault_addr.iter())
            .map(|(s, a)| (s.load(Ordering::Acquire), a.load(Ordering::Relaxed)))
            .filter(|&(s, _)| s != 0)
            .min()
        else {
            continue;
        };
        let waited = inner.now_ns().saturating_sub(started);
        if waited > limit && started != reported {
            reported = started;
            inner.stats.watchdog_reports.fetch_add(1, Ordering::Relaxed);
            let mut bricks: Vec<String> = inner.table.all().iter().map(|b| b.addr.to_string()).collect();
            bricks.dedup();
            eprintln!(
                "rackmem: watchdog: the fault at {:#x} has waited {:.1} s (limit {:.1} s); bricks: {}",
                addr,
                waited as f64 / 1e9,
                limit as f64 / 1e9,
                bricks.join(", ")
            );
        }
    }
}
