//! kstack client (placeholder until the client lands).

fn main() {}
