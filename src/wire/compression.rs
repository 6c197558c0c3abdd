//! The compressors of OP_COMPRESSED: snappy (1), zlib (2) and zstd (3), each done by its
//! usual crate.

use std::io::{Read, Write};

use super::WireError;
use crate::value::error_codes::ErrorCode;

/// A compressor a client may negotiate in its handshake's `compression` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compressor {
    /// No compression (id 0): the body is carried as is.
    Noop,
    /// Snappy (id 1).
    Snappy,
    /// zlib (id 2).
    Zlib,
    /// Zstandard (id 3).
    Zstd,
}

impl Compressor {
    /// Compressors Sluice accepts, in the order they are listed in `serverStatus`.
    pub const SUPPORTED: [Compressor; 3] = [Compressor::Snappy, Compressor::Zstd, Compressor::Zlib];

    /// The compressor a handshake names, if supported.
    pub fn from_name(name: &str) -> Option<Compressor> {
        match name {
            "snappy" => Some(Compressor::Snappy),
            "zlib" => Some(Compressor::Zlib),
            "zstd" => Some(Compressor::Zstd),
            "noop" => Some(Compressor::Noop),
            _ => None,
        }
    }

    /// The compressor with this wire id.
    pub fn from_id(id: u8) -> Option<Compressor> {
        match id {
            0 => Some(Compressor::Noop),
            1 => Some(Compressor::Snappy),
            2 => Some(Compressor::Zlib),
            3 => Some(Compressor::Zstd),
            _ => None,
        }
    }

    /// The name used in handshakes and `serverStatus`.
    pub fn name(self) -> &'static str {
        match self {
            Compressor::Noop => "noop",
            Compressor::Snappy => "snappy",
            Compressor::Zlib => "zlib",
            Compressor::Zstd => "zstd",
        }
    }

    /// The id carried in OP_COMPRESSED.
    pub fn id(self) -> u8 {
        match self {
            Compressor::Noop => 0,
            Compressor::Snappy => 1,
            Compressor::Zlib => 2,
            Compressor::Zstd => 3,
        }
    }

    /// Compresses `data`.
    pub fn compress(self, data: &[u8]) -> Result<Vec<u8>, WireError> {
        match self {
            Compressor::Noop => Ok(data.to_vec()),
            Compressor::Snappy => snap::raw::Encoder::new()
                .compress_vec(data)
                .map_err(|e| failed(self, e)),
            Compressor::Zlib => {
                let mut enc = flate2::write::ZlibEncoder::new(
                    Vec::with_capacity(data.len() / 2),
                    flate2::Compression::new(6),
                );
                enc.write_all(data).map_err(|e| failed(self, e))?;
                enc.finish().map_err(|e| failed(self, e))
            }
            Compressor::Zstd => zstd::bulk::compress(data, 6).map_err(|e| failed(self, e)),
        }
    }

    /// Decompresses `data`, which must expand to exactly `expected_len` bytes (the
    /// `uncompressedSize` of the header, already checked against the message size limit).
    pub fn decompress(self, data: &[u8], expected_len: usize) -> Result<Vec<u8>, WireError> {
        let out = match self {
            Compressor::Noop => data.to_vec(),
            Compressor::Snappy => {
                let len = snap::raw::decompress_len(data).map_err(|e| failed(self, e))?;
                if len != expected_len {
                    return Err(size_mismatch(len, expected_len));
                }
                snap::raw::Decoder::new()
                    .decompress_vec(data)
                    .map_err(|e| failed(self, e))?
            }
            Compressor::Zlib => {
                let mut out = Vec::with_capacity(expected_len);
                // Read one byte more than announced so an overlong stream is noticed.
                flate2::read::ZlibDecoder::new(data)
                    .take(expected_len as u64 + 1)
                    .read_to_end(&mut out)
                    .map_err(|e| failed(self, e))?;
                out
            }
            Compressor::Zstd => {
                zstd::bulk::decompress(data, expected_len).map_err(|e| failed(self, e))?
            }
        };
        if out.len() != expected_len {
            return Err(size_mismatch(out.len(), expected_len));
        }
        Ok(out)
    }
}

fn failed(c: Compressor, e: impl std::fmt::Display) -> WireError {
    WireError::invalid(
        ErrorCode::BadValue,
        format!("{} (de)compression failed: {e}", c.name()),
    )
}

fn size_mismatch(actual: usize, expected: usize) -> WireError {
    WireError::invalid(
        ErrorCode::BadValue,
        format!("Decompressing message returned {actual} bytes, expected {expected}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_compressor_round_trips() {
        let data: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 97).to_le_bytes())
            .collect();
        for c in [
            Compressor::Noop,
            Compressor::Snappy,
            Compressor::Zlib,
            Compressor::Zstd,
        ] {
            let packed = c.compress(&data).unwrap();
            assert_eq!(c.decompress(&packed, data.len()).unwrap(), data, "{c:?}");
            assert!(c.decompress(&packed, data.len() - 1).is_err(), "{c:?}");
            assert_eq!(Compressor::from_id(c.id()), Some(c));
            assert_eq!(Compressor::from_name(c.name()), Some(c));
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for c in Compressor::SUPPORTED {
            assert!(c.decompress(&[1, 2, 3, 4, 5, 6, 7], 100).is_err(), "{c:?}");
        }
    }
}
