//! `write_files`: decoding entry contents and writing them into the machine's filesystem view.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use base64::Engine;

use crate::cloud_config::WriteFile;
use crate::error::MachineError;

/// cloud-init's default mode for written files.
const DEFAULT_MODE: u32 = 0o644;

/// The bytes an entry stands for, after its `encoding`.
pub fn decode_content(file: &WriteFile) -> Result<Vec<u8>, MachineError> {
    let encoding = file
        .encoding
        .as_deref()
        .unwrap_or("text/plain")
        .trim()
        .to_ascii_lowercase();
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        MachineError::UserData(format!(
            "write_files {}: content is not valid {what}: {e}",
            file.path
        ))
    };
    let base64 = |text: &str| {
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|e| bad("base64", &e))
    };
    let gunzip = |bytes: &[u8]| {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| bad("gzip", &e))?;
        Ok::<_, MachineError>(out)
    };
    match encoding.as_str() {
        "text/plain" | "" => Ok(file.content.as_bytes().to_vec()),
        "b64" | "base64" => base64(&file.content),
        "gz" | "gzip" => gunzip(file.content.as_bytes()),
        "gz+b64" | "gz+base64" | "gzip+b64" | "gzip+base64" => gunzip(&base64(&file.content)?),
        other => Err(MachineError::UserData(format!(
            "write_files {}: unknown encoding {other:?} (use b64, base64, gz, gzip or gz+b64)",
            file.path
        ))),
    }
}

/// Where an absolute machine path lands when the machine's `/` is `base`. Refuses relative
/// paths and `..`, which could escape the machine's view.
pub fn resolve_under(base: &Path, machine_path: &str) -> Result<PathBuf, MachineError> {
    let path = Path::new(machine_path);
    if !path.is_absolute() {
        return Err(MachineError::UserData(format!(
            "write_files path {machine_path:?} must be absolute"
        )));
    }
    let mut out = base.to_path_buf();
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(MachineError::UserData(format!(
                    "write_files path {machine_path:?} must not contain `..`"
                )));
            }
        }
    }
    Ok(out)
}

/// Write (or append) one entry under `base`, creating parent directories, and set its mode.
/// Returns the path written.
pub fn write_entry(base: &Path, file: &WriteFile) -> Result<PathBuf, MachineError> {
    let target = resolve_under(base, &file.path)?;
    let content = decode_content(file)?;
    let mode = match &file.permissions {
        Some(permissions) => permissions.mode()?,
        None => DEFAULT_MODE,
    };
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(MachineError::io(parent))?;
    }
    let mut handle = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(file.append)
        .truncate(!file.append)
        .open(&target)
        .map_err(MachineError::io(&target))?;
    handle.write_all(&content).map_err(MachineError::io(&target))?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
        .map_err(MachineError::io(&target))?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud_config::Permissions;

    fn entry(path: &str, content: &str, encoding: Option<&str>) -> WriteFile {
        WriteFile {
            path: path.into(),
            content: content.into(),
            encoding: encoding.map(str::to_string),
            permissions: Some(Permissions::Text("0600".into())),
            owner: None,
            append: false,
        }
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn decodes_every_cloud_init_encoding() {
        assert_eq!(decode_content(&entry("/a", "hi\n", None)).unwrap(), b"hi\n");
        assert_eq!(
            decode_content(&entry("/a", "aGVs\nbG8K", Some("b64"))).unwrap(),
            b"hello\n"
        );
        assert_eq!(
            decode_content(&entry("/a", "aGVsbG8K", Some("base64"))).unwrap(),
            b"hello\n"
        );
        let packed = base64::engine::general_purpose::STANDARD.encode(gzip(b"zipped"));
        assert_eq!(
            decode_content(&entry("/a", &packed, Some("gz+b64"))).unwrap(),
            b"zipped"
        );
        assert_eq!(
            decode_content(&entry("/a", &packed, Some("gzip+base64"))).unwrap(),
            b"zipped"
        );
        let err = decode_content(&entry("/a", "x", Some("rot13"))).unwrap_err();
        assert!(err.to_string().contains("rot13"), "{err}");
        assert!(decode_content(&entry("/a", "!!", Some("b64"))).is_err());
    }

    #[test]
    fn paths_stay_under_the_base() {
        let base = Path::new("/m");
        assert_eq!(
            resolve_under(base, "/etc/hosts").unwrap(),
            Path::new("/m/etc/hosts")
        );
        assert!(resolve_under(base, "etc/hosts").is_err());
        assert!(resolve_under(base, "/etc/../../x").is_err());
    }

    #[test]
    fn writes_appends_and_sets_modes() {
        let dir = std::env::temp_dir().join(format!("sim-write-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let written = write_entry(&dir, &entry("/etc/etcd/pki/ca.key", "KEY", None)).unwrap();
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "KEY");
        let mode = std::fs::metadata(&written).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        let mut more = entry("/etc/etcd/pki/ca.key", "+MORE", None);
        more.append = true;
        write_entry(&dir, &more).unwrap();
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "KEY+MORE");
        write_entry(&dir, &entry("/etc/etcd/pki/ca.key", "NEW", None)).unwrap();
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "NEW");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
