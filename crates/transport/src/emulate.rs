//! A link emulator: responses are handed to their waiters as late as a given network would have
//! delivered them, so a researcher can ask what a program would do over 25 GbE, RDMA or a CXL
//! switch on a machine that has none (`rackmem run --emulate SPEC`, which sets
//! [`EMULATE_ENV`] for every link the program makes).
//!
//! The real link (a loopback socket) already costs what software costs; the emulator adds what
//! the wire would: for a request of `q` bytes sent at `s` and its response of `r` bytes,
//!
//! ```text
//! sent on the wire   = max(s, previous request's end) + wire(q) / rate    (requests queue up)
//! arrived            = when the response was read off the socket, at the earliest s
//! handed to waiter   = max(previous response's end,
//!                          arrived + 2 × latency + (sent on the wire − s)) + wire(r) / rate
//! ```
//!
//! so latency overlaps between requests in flight while bandwidth is shared, in each direction
//! separately, as on a full-duplex link. `wire()` counts packets and their overhead as
//! `rackmem_model::link` does, and `rackmem model link` predicts from the same parameters: the
//! two are checked against each other by `rackmem bench emulate`.
//!
//! Limits of the method: a response is timed from when a thread reads it off the socket, so a
//! response left unread for a while (a read-ahead collected at the next fault) is charged its
//! wire time from then, not from when it arrived: read-ahead looks worse emulated than it would
//! be. The last 200 µs of a wait are spun, since a sleep oversleeps by tens of
//! microseconds on virtual machines, and a spinning waiter is what a network's completion
//! polling looks like anyway.

use crate::sync::lock;
use rackmem_model::link::{Link as Wire, LinkSpec};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The environment variable that makes every link of a process emulated (a [`LinkSpec`]:
/// `latency=5us,bandwidth=25Gbit`, or a preset such as `100g-rdma`).
pub const EMULATE_ENV: &str = "RACKMEM_LINK_EMULATE";

/// The emulation of one link.
pub(crate) struct Emulator {
    wire: Wire,
    state: Mutex<State>,
}

struct State {
    /// When the request direction is free again.
    tx_free: Instant,
    /// When the response direction is free again.
    rx_free: Instant,
    /// Per tag in flight: when it was sent, and how long it queued and took on the wire.
    sent: HashMap<u32, (Instant, Duration)>,
}

impl Emulator {
    pub(crate) fn new(wire: Wire) -> Emulator {
        let now = Instant::now();
        Emulator {
            wire,
            state: Mutex::new(State {
                tx_free: now,
                rx_free: now,
                sent: HashMap::new(),
            }),
        }
    }

    /// The emulation the environment asks for, if any; a specification that does not parse is
    /// an error naming the variable.
    pub(crate) fn from_env() -> Result<Option<Emulator>, String> {
        match std::env::var(EMULATE_ENV) {
            Ok(spec) if !spec.trim().is_empty() => spec
                .parse::<LinkSpec>()
                .map(|s| Some(Emulator::new(s.0)))
                .map_err(|e| format!("{EMULATE_ENV}: {e}")),
            _ => Ok(None),
        }
    }

    fn wire_time(&self, bytes: u64) -> Duration {
        let lanes = f64::from(self.wire.lanes.max(1));
        Duration::from_secs_f64(self.wire.serialize_s(bytes) / lanes)
    }

    /// A request of `bytes` with `tag` is being sent now.
    pub(crate) fn sent(&self, tag: u32, bytes: u64) {
        let now = Instant::now();
        let mut st = lock(&self.state);
        let done = st.tx_free.max(now) + self.wire_time(bytes);
        st.tx_free = done;
        // Bounded by the link's requests in flight; a tag never answered (the link broke) is
        // dropped with the link.
        st.sent.insert(tag, (now, done - now));
    }

    /// The response to `tag`, `bytes` long, was read off the socket at `arrived`: when its
    /// waiter may have it.
    pub(crate) fn deliver_at(&self, tag: u32, bytes: u64, arrived: Instant) -> Instant {
        let mut st = lock(&self.state);
        let (sent_at, on_wire) = st.sent.remove(&tag).unwrap_or((arrived, Duration::ZERO));
        let latency = Duration::from_secs_f64(2.0 * self.wire.latency_s);
        let start = st.rx_free.max(arrived.max(sent_at) + latency + on_wire);
        let done = start + self.wire_time(bytes);
        st.rx_free = done;
        done
    }
}

/// Returns at `t` or just after: sleeps while far, then spins until it is time.
pub(crate) fn wait_until(t: Instant) {
    const SPIN: Duration = Duration::from_micros(200);
    loop {
        let now = Instant::now();
        if now >= t {
            return;
        }
        let left = t - now;
        if left > SPIN {
            std::thread::sleep(left - SPIN);
        } else {
            // Not yield_now: on a busy machine a yield gives the CPU away for a whole time
            // slice, milliseconds against the microseconds being emulated.
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emu(spec: &str) -> Emulator {
        Emulator::new(spec.parse::<LinkSpec>().expect("spec").0)
    }

    #[test]
    fn one_request_pays_two_latencies_and_both_wire_times() {
        // 1 GB/s, packets of 1448 + 90 bytes: 48-byte request 138 ns, 4128-byte response 4398 ns.
        let e = emu("latency=10us,bandwidth=8Gbit");
        e.sent(7, 48);
        let arrived = Instant::now();
        let at = e.deliver_at(7, 4128, arrived);
        let extra = at - arrived;
        let expect = 20_000 + 138 + 4398;
        assert!(extra.as_nanos().abs_diff(expect) < 1000, "{extra:?} vs {expect} ns");
    }

    #[test]
    fn responses_share_the_bandwidth_and_overlap_the_latency() {
        let e = emu("latency=10us,bandwidth=8Gbit");
        for tag in 1..=8 {
            e.sent(tag, 48);
        }
        let arrived = Instant::now();
        let times: Vec<Instant> = (1..=8).map(|tag| e.deliver_at(tag, 65568, arrived)).collect();
        // 65,568 bytes are 46 packets: 69,708 bytes, 69.7 µs at 1 GB/s each, one after another,
        // while the 20 µs of latency is paid once.
        let gap = times[7] - times[6];
        assert!(gap.as_nanos().abs_diff(69_708) < 100, "{gap:?}");
        let total = times[7] - arrived;
        assert!(total < Duration::from_micros(20 + 8 * 70 + 5), "{total:?}");
    }

    #[test]
    fn an_unknown_tag_is_delivered_with_latency_only() {
        let e = emu("latency=1us,bandwidth=100Gbit");
        let arrived = Instant::now();
        assert!(e.deliver_at(99, 32, arrived) >= arrived + Duration::from_micros(2));
    }

    #[test]
    fn waiting_until_a_time_is_not_early() {
        let t = Instant::now() + Duration::from_micros(300);
        wait_until(t);
        assert!(Instant::now() >= t);
    }
}
