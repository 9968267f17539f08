/// Responders and streams that belong to no connection, so a `.deferred` or `.stream` result
/// can be driven outside the server (tests, fuzz targets). They behave as the real ones do
/// after their connection has gone: nothing is ever suspended or resumed.
extension HTTPResponder {
    /// A responder whose `respond` only keeps the answer, for `detachedResponse`.
    package static func detached() -> HTTPResponder {
        // `init(connection:)` wants a handle; this one is dropped before anything can use it
        // (only a suspended responder touches its connection, and this one never suspends).
        let responder = HTTPResponder(connection: MHDConnection(raw: OpaquePointer(bitPattern: 0x1)!))
        responder.state.withLock { $0.connection = nil }
        return responder
    }

    /// A responder of no connection that hands its answer, once given, to `onAnswer` (on the
    /// thread that answers): a request run inside another (`/v1/cluster/relay`).
    package static func detached(onAnswer: @escaping @Sendable (HTTPResponse) -> Void) -> HTTPResponder {
        let responder = detached()
        responder.state.withLock { $0.onAnswer = onAnswer }
        return responder
    }

    /// The answer given so far (nil while pending). Only meaningful for `detached()` responders:
    /// a server's responder hands its answer to MHD.
    package var detachedResponse: HTTPResponse? {
        state.withLock { $0.response }
    }
}

extension HTTPStream {
    /// A stream whose bytes are kept until `takeDetachedBytes()`.
    package static func detached() -> HTTPStream {
        let stream = HTTPStream(connection: MHDConnection(raw: OpaquePointer(bitPattern: 0x1)!))
        stream.state.withLock { $0.connection = nil }
        return stream
    }

    /// The bytes sent since the last call (and forgets them).
    package func takeDetachedBytes() -> [UInt8] {
        state.withLock { state in
            let bytes = Array(state.buffer[state.offset...])
            state.buffer = []
            state.offset = 0
            return bytes
        }
    }
}
