//! rackmem proto (placeholder)
