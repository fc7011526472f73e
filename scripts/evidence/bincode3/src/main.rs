//! Fails to compile on purpose: `bincode 3.0.0`'s whole library is one `compile_error!`.
//! `scripts/evidence/run bincode` builds this and prints the compiler's message.

fn main() {
    let bytes = bincode::serde::encode_to_vec(&(1u64, "record"), bincode::config::standard());
    println!("{bytes:?}");
}
