//! `schemas/README.md` must match the table definitions. `COA_BLESS=1` regenerates it.

#[test]
fn schema_reference_is_up_to_date() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let want = coa_schemas::tables::reference_markdown();
    if std::env::var_os("COA_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "schemas/README.md is stale: run `make schemas-doc` (COA_BLESS=1 cargo test -p coa-schemas --test reference_doc)"
    );
}
