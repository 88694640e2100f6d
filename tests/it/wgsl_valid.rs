//! Every WGSL template in `shaders/`, with its placeholders at their defaults, passes naga's WGSL
//! front end and validator. CPU only: no device needed.

use rumus::codegen::templates::{Template, TEMPLATES};

fn validate(name: &str, src: &str) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), Default::default())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
}

#[test]
fn every_shader_file_is_a_registered_template() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/shaders");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".wgsl"))
        .collect();
    files.sort();
    for f in &files {
        let t = TEMPLATES.iter().find(|t| t.file == f);
        let t = t.unwrap_or_else(|| panic!("shaders/{f} is not in codegen::templates::TEMPLATES"));
        let on_disk = std::fs::read_to_string(format!("{dir}/{f}")).unwrap();
        assert_eq!(t.text, on_disk, "{f}: compiled-in text differs from the file");
    }
    assert_eq!(files.len(), TEMPLATES.len(), "a registered template has no file in shaders/");
}

#[test]
fn every_template_is_valid_wgsl_with_defaults() {
    for t in TEMPLATES {
        let src = t.fill(&[]).unwrap();
        assert!(src.starts_with("//") && src.contains("alias scalar = f32;"), "{}", t.file);
        validate(t.file, &src);
    }
}

#[test]
fn matmul_tile_shapes_are_valid_wgsl() {
    for (bm, bn, bk, tm, tn) in [("64", "64", "8", "4", "4"), ("128", "64", "16", "8", "4")] {
        let t: &Template = &rumus::codegen::templates::MATMUL;
        let src = t.fill(&[("BM", bm), ("BN", bn), ("BK", bk), ("TM", tm), ("TN", tn)]).unwrap();
        validate("matmul.wgsl", &src);
    }
}

#[test]
fn layer_norm_widths_are_valid_wgsl() {
    for cpt in ["1", "32"] {
        validate(
            "layer_norm.wgsl",
            &rumus::codegen::templates::LAYER_NORM.fill(&[("CPT", cpt)]).unwrap(),
        );
        validate(
            "layer_norm_bw.wgsl",
            &rumus::codegen::templates::LAYER_NORM_BW.fill(&[("CPT", cpt)]).unwrap(),
        );
    }
}

#[test]
fn fill_rejects_unknown_placeholder() {
    let e = rumus::codegen::templates::LAYER_NORM.fill(&[("NOPE", "1")]).unwrap_err();
    assert!(e.message.contains("NOPE"), "{}", e.message);
}
