//! The runtime's errors.

use crate::{agent, config};
use rackmem_sys::SysError;
use rackmem_transport::LinkError;
use rackmem_uffd::UffdError;

/// Errors starting or running the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// A userfaultfd call failed.
    #[error(transparent)]
    Uffd(#[from] UffdError),
    /// A memory-mapping call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// A brick could not be reached or refused.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The bricks gave no memory.
    #[error("no brick could give a segment of at least 16 MiB: {0}")]
    NoSegment(String),
    /// The node agent could not be reached or refused.
    #[error(transparent)]
    Agent(#[from] agent::AgentError),
    /// The eventfd that wakes the fault handler could not be created (out of descriptors?).
    #[error("cannot create the fault handler's doorbell (eventfd): {0}")]
    Doorbell(std::io::Error),
}
