//! Conversations with the driver over any [`Transport`]: build the request
//! with kstack-abi, check the reply's status, decode it with kstack-abi.

use kstack_abi::{
    Ioctl, StatusResponse,
    messages::STATUS_RESPONSE_SIZE,
    ntstatus::{STATUS_BUFFER_OVERFLOW, STATUS_SUCCESS},
};

use crate::{error::ClientError, transport::Transport};

/// Asks for the driver's status. A driver of another ABI version is
/// reported as a mismatch, whatever its status layout.
///
/// # Errors
/// [`ClientError`] for a refusal, a version mismatch or a malformed reply.
pub fn status(transport: &mut impl Transport) -> Result<StatusResponse, ClientError> {
    let mut output = [0_u8; STATUS_RESPONSE_SIZE];
    let reply = transport.control(Ioctl::Status.code(), &[], &mut output);
    // STATUS_BUFFER_OVERFLOW: the driver's status is larger than ours, so it
    // wrote the version prefix only; decoding that reports the mismatch.
    if reply.status != STATUS_SUCCESS && reply.status != STATUS_BUFFER_OVERFLOW {
        return Err(ClientError::Refused {
            request: Ioctl::Status,
            status: reply.status,
        });
    }
    let written = output.get(..reply.information).unwrap_or(&output);
    StatusResponse::decode(written).map_err(|error| ClientError::from_reply(Ioctl::Status, error))
}

#[cfg(test)]
pub mod tests {
    use kstack_abi::{
        ABI_VERSION, CaptureConfig, DecodeError, PagingExecutive, Source, SourceStatus,
        ntstatus::{NtStatus, STATUS_INVALID_DEVICE_REQUEST},
    };

    use super::*;
    use crate::transport::Reply;

    /// Answers every request with fixed bytes and a status.
    pub struct Scripted {
        pub status: NtStatus,
        pub bytes: Vec<u8>,
        pub requests: Vec<u32>,
    }

    impl Transport for Scripted {
        fn control(&mut self, code: u32, _input: &[u8], output: &mut [u8]) -> Reply {
            self.requests.push(code);
            let written = self.bytes.len().min(output.len());
            output[..written].copy_from_slice(&self.bytes[..written]);
            Reply {
                status: self.status,
                information: written,
            }
        }
    }

    pub fn sample_status() -> StatusResponse {
        StatusResponse {
            driver_version: (0, 1, 0),
            paging_executive: PagingExecutive::NotSet,
            ring_ready: true,
            ring_capacity: 8192,
            ring_used: 3,
            outstanding_allocations: 2,
            config: CaptureConfig::default(),
            dropped: 0,
            cleared: 0,
            next_sequence: 3,
            sources: [SourceStatus {
                registration: 0,
                available: true,
                captured: 1,
                skipped_irql: 0,
            }; Source::COUNT],
        }
    }

    fn encoded(status: &StatusResponse) -> Vec<u8> {
        let mut bytes = vec![0; STATUS_RESPONSE_SIZE];
        status.encode(&mut bytes);
        bytes
    }

    #[test]
    fn a_good_reply_decodes() {
        let mut driver = Scripted {
            status: STATUS_SUCCESS,
            bytes: encoded(&sample_status()),
            requests: vec![],
        };
        assert_eq!(status(&mut driver), Ok(sample_status()));
        assert_eq!(driver.requests, [Ioctl::Status.code()]);
    }

    #[test]
    fn a_newer_driver_is_a_version_mismatch() {
        // A driver whose status is larger sends its prefix only.
        let mut prefix = (ABI_VERSION + 1).to_le_bytes().to_vec();
        prefix.extend_from_slice(&512_u32.to_le_bytes());
        let mut driver = Scripted {
            status: STATUS_BUFFER_OVERFLOW,
            bytes: prefix,
            requests: vec![],
        };
        assert_eq!(
            status(&mut driver),
            Err(ClientError::AbiMismatch {
                driver: ABI_VERSION + 1
            })
        );
    }

    #[test]
    fn refusals_and_garbage_are_errors_not_panics() {
        let mut refused = Scripted {
            status: STATUS_INVALID_DEVICE_REQUEST,
            bytes: vec![],
            requests: vec![],
        };
        assert_eq!(
            status(&mut refused),
            Err(ClientError::Refused {
                request: Ioctl::Status,
                status: STATUS_INVALID_DEVICE_REQUEST
            })
        );
        let mut truncated = encoded(&sample_status());
        truncated.truncate(100);
        let mut short = Scripted {
            status: STATUS_SUCCESS,
            bytes: truncated,
            requests: vec![],
        };
        assert!(matches!(
            status(&mut short),
            Err(ClientError::Malformed { .. })
        ));
        for length in 0..STATUS_RESPONSE_SIZE {
            let mut bytes = encoded(&sample_status());
            bytes.truncate(length);
            let mut driver = Scripted {
                status: STATUS_SUCCESS,
                bytes,
                requests: vec![],
            };
            assert!(status(&mut driver).is_err(), "{length} bytes");
        }
        let mut empty = Scripted {
            status: STATUS_SUCCESS,
            bytes: vec![],
            requests: vec![],
        };
        assert_eq!(
            status(&mut empty),
            Err(ClientError::Malformed {
                request: Ioctl::Status,
                error: DecodeError::Truncated {
                    needed: 4,
                    actual: 0
                }
            })
        );
    }
}
