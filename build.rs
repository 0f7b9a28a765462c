// `sqlx::migrate!` embeds the migrations at compile time; without this a new migration
// file is not seen until some source file changes.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
