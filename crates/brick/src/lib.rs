//! rackmem brick (placeholder)
