//! rackmem transport (placeholder)
