//! What more than one of idem's benches uses.
