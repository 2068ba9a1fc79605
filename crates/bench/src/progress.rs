//! Progress bars of the bench commands, and one display for a whole suite.
//!
//! Every part creates its bar with [`bar`]. Alone, that is a plain bar on stderr; while a
//! [`Suite`] is alive, the part's bar joins the suite's display under the suite's overall bar
//! (one bar over the parts, one for the current part), instead of drawing over it.

use std::sync::Mutex;

static SUITE: Mutex<Option<indicatif::MultiProgress>> = Mutex::new(None);

fn style() -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
}

/// A progress bar of `len` steps, in the suite's display when a suite runs.
pub fn bar(len: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(style());
    match SUITE.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(m) => m.add(pb),
        None => pb,
    }
}

/// The display of a suite run: its overall bar, over `parts` parts, stays on top while parts
/// come and go below it. Dropping it ends the display.
pub struct Suite {
    /// The overall bar: one step per part.
    pub overall: indicatif::ProgressBar,
}

impl Suite {
    /// Starts the display.
    pub fn start(parts: u64) -> Suite {
        let m = indicatif::MultiProgress::new();
        let overall = m.add(indicatif::ProgressBar::new(parts));
        overall.set_style(
            indicatif::ProgressStyle::with_template("suite {bar:30} {pos}/{len} parts: {msg} [{elapsed}]")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        *SUITE.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
        Suite { overall }
    }
}

impl Drop for Suite {
    fn drop(&mut self) {
        self.overall.finish_and_clear();
        *SUITE.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}
