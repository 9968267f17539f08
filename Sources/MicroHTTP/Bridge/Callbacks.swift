internal import CMicroHTTPD
import Glibc

/// libmicrohttpd's callbacks. They are C function pointers that capture nothing; each receives the
/// `ServerCore` (or a per-request / per-stream object) as an unmanaged context pointer.
///
/// They live at type scope in a non-main file on purpose: a closure that Swift 6 considers
/// main-actor isolated gets an isolation check that traps when MHD calls it on its own threads.
enum Callbacks {
    /// MHD_OPTION_URI_LOG_CALLBACK: called once per request, before the headers, with the request
    /// target as sent. Its result becomes the request's `con_cls`: the per-request context,
    /// retained here and released in `requestCompleted`.
    static let requestStarted: @convention(c) (
        UnsafeMutableRawPointer?, UnsafePointer<CChar>?, OpaquePointer?
    ) -> UnsafeMutableRawPointer? = { cls, uri, _ in
        let server = Unmanaged<ServerCore>.fromOpaque(cls!).takeUnretainedValue()
        server.inFlight.add(1, ordering: .relaxed)
        return Unmanaged.passRetained(RequestContext(path: uri.map(rawPath) ?? "/")).toOpaque()
    }

    /// MHD_OPTION_NOTIFY_COMPLETED: the request is over (answered, failed, client gone or daemon
    /// stopping). Releases the per-request context and tells its responder or stream.
    static let requestCompleted: MHD_RequestCompletedCallback = { cls, _, contextSlot, _ in
        guard let cls, let contextSlot, let raw = contextSlot.pointee else { return }
        contextSlot.pointee = nil
        let server = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
        let context = Unmanaged<RequestContext>.fromOpaque(raw).takeRetainedValue()
        server.inFlight.subtract(1, ordering: .releasing)
        let responder = context.responder
        let stream = context.stream
        if responder == nil && stream == nil { return }
        responder?.requestEnded()
        stream?.finish(connectionGone: true)
        server.unregister(responder: responder, stream: stream)
    }

    /// The access handler: MHD calls it once the headers are in, once per body chunk, and a final
    /// time with no data, which is when the Swift handler runs (and again after a resume).
    static let access: MHD_AccessHandlerCallback = {
        cls, connection, url, method, _, uploadData, uploadDataSize, contextSlot in
        guard let cls, let connection, let uploadDataSize, let contextSlot else { return .NO }
        let server = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
        let context: RequestContext
        if let raw = contextSlot.pointee {
            context = Unmanaged<RequestContext>.fromOpaque(raw).takeUnretainedValue()
        } else {
            // Not expected (the URI log callback always runs first), but keep the invariant.
            server.inFlight.add(1, ordering: .relaxed)
            context = RequestContext(path: url.map { String(cString: $0) } ?? "/")
            contextSlot.pointee = Unmanaged.passRetained(context).toOpaque()
        }
        return server.handle(
            context, connection: connection, method: method, uploadData: uploadData,
            uploadDataSize: uploadDataSize)
    }

    /// MHD_OPTION_EXTERNAL_LOGGER: formats MHD's printf-style message.
    static let log: MHD_LogCallback = { cls, format, arguments in
        guard let cls, let format, let arguments else { return }
        let message = withUnsafeTemporaryAllocation(of: CChar.self, capacity: 512) { buffer in
            let written = vsnprintf(buffer.baseAddress!, buffer.count, format, arguments)
            guard written > 0 else { return "" }
            let length = min(Int(written), buffer.count - 1)
            return String(decoding: UnsafeRawBufferPointer(start: buffer.baseAddress!, count: length), as: UTF8.self)
        }
        var trimmed = Substring(message)
        while let last = trimmed.last, last.isWhitespace { trimmed.removeLast() }
        Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue().mhdLogged(String(trimmed))
    }

    /// Content reader of a streamed response; its context is the `HTTPStream`, retained for MHD.
    static let streamRead: MHD_ContentReaderCallback = { cls, _, buffer, capacity in
        guard let cls, let buffer else { return -2 }  // MHD_CONTENT_READER_END_WITH_ERROR
        let stream = Unmanaged<HTTPStream>.fromOpaque(cls).takeUnretainedValue()
        return stream.read(into: buffer, capacity: capacity)
    }

    /// Called when MHD destroys a streamed response (after the request ended): releases the stream.
    static let streamFree: MHD_ContentReaderFreeCallback = { cls in
        guard let cls else { return }
        Unmanaged<HTTPStream>.fromOpaque(cls).takeRetainedValue().finish(connectionGone: true)
    }

    /// Collects header fields into a `[String: String]` (names lowercased, repeats joined).
    static let collectHeader: MHD_KeyValueIteratorN = { cls, _, key, keySize, value, valueSize in
        guard let cls, let key else { return .YES }
        let headers = cls.assumingMemoryBound(to: [String: String].self)
        let name = String(unsafeUninitializedCapacity: keySize) { name in
            for index in 0..<keySize {
                let byte = UInt8(bitPattern: key[index])
                name[index] = byte &- 65 < 26 ? byte | 0x20 : byte
            }
            return keySize
        }
        let text = value.map { string(from: $0, count: valueSize) } ?? ""
        if let earlier = headers.pointee.updateValue(text, forKey: name) {
            headers.pointee[name] = earlier + (name == "cookie" ? "; " : ", ") + text
        }
        return .YES
    }

    /// Collects query arguments (already percent-decoded by MHD); the last repeat wins.
    static let collectArgument: MHD_KeyValueIteratorN = { cls, _, key, keySize, value, valueSize in
        guard let cls, let key else { return .YES }
        let query = cls.assumingMemoryBound(to: [String: String].self)
        query.pointee[string(from: key, count: keySize)] = value.map { string(from: $0, count: valueSize) } ?? ""
        return .YES
    }
}

@inline(__always)
private func string(from bytes: UnsafePointer<CChar>, count: Int) -> String {
    String(decoding: UnsafeRawBufferPointer(start: bytes, count: count), as: UTF8.self)
}

/// The request target up to the query string, as sent.
private func rawPath(_ uri: UnsafePointer<CChar>) -> String {
    var length = 0
    while uri[length] != 0 && uri[length] != 0x3F /* ? */ { length += 1 }
    return string(from: uri, count: length)
}

// MARK: - Request handling (server threads)

extension ServerCore {
    func handle(
        _ context: RequestContext, connection: OpaquePointer, method: UnsafePointer<CChar>?,
        uploadData: UnsafePointer<CChar>?, uploadDataSize: UnsafeMutablePointer<Int>
    ) -> MHD_Result {
        switch context.phase {
        case .headers:
            context.phase = .body
            let count = MHD_get_connection_values_n(connection, .HEADER_KIND, nil, nil)
            if count > 0 {
                context.headers.reserveCapacity(Int(count))
                withUnsafeMutablePointer(to: &context.headers) { headers in
                    _ = MHD_get_connection_values_n(connection, .HEADER_KIND, Callbacks.collectHeader, headers)
                }
            }
            if let declared = context.headers["content-length"], let length = Int(declared), length > 0 {
                if length > maxBodyBytes {
                    // Answering before the body is read makes MHD skip it and close the connection;
                    // with `Expect: 100-continue` the client never sends it.
                    context.phase = .done
                    return queue(.payloadTooLarge(bodyBytes: length, limit: maxBodyBytes), on: connection)
                }
                context.body.reserveCapacity(length)
            }
            return .YES

        case .body:
            let size = uploadDataSize.pointee
            if size > 0 {
                // A body chunk; MHD cannot queue a response now, only consume the data.
                context.received += size
                if !context.tooLarge {
                    if context.received > maxBodyBytes {
                        context.tooLarge = true
                        context.body = []
                    } else if let uploadData {
                        context.body.append(contentsOf: UnsafeRawBufferPointer(start: uploadData, count: size))
                    }
                }
                uploadDataSize.pointee = 0
                if context.received > discardLimit {
                    log("warning", "dropping a connection whose request body passed \(discardLimit) bytes")
                    return .NO
                }
                return .YES
            }
            context.phase = .done
            if context.tooLarge {
                return queue(.payloadTooLarge(bodyBytes: context.received, limit: maxBodyBytes), on: connection)
            }
            return runHandler(context, connection: connection, method: method)

        case .waiting:
            // Called again after `respond` resumed the connection.
            return answerOrSuspend(context, connection: connection)

        case .done:
            // A response is already queued; MHD does not call again then.
            return .NO
        }
    }

    private func runHandler(
        _ context: RequestContext, connection: OpaquePointer, method: UnsafePointer<CChar>?
    ) -> MHD_Result {
        var query: [String: String] = [:]
        withUnsafeMutablePointer(to: &query) { query in
            _ = MHD_get_connection_values_n(connection, .GET_ARGUMENT_KIND, Callbacks.collectArgument, query)
        }
        let body = context.body
        context.body = []
        let request = HTTPRequest(
            id: lastRequestID.add(1, ordering: .relaxed).newValue,
            method: method.map { String(cString: $0) } ?? "GET",
            path: context.path,
            query: query,
            headers: context.headers,
            body: body
        )
        let result: HTTPHandlerResult
        do {
            result = try handler(request)
        } catch {
            log("error", "request \(request.id) \(request.method) \(request.path) failed: \(String(describing: error))")
            return queue(.internalError, on: connection)
        }
        switch result {
        case .response(let response):
            return queue(response, on: connection)
        case .deferred(let body):
            let responder = HTTPResponder(connection: MHDConnection(raw: connection))
            context.responder = responder
            context.phase = .waiting
            let accepted = register(responder)
            body(responder)
            if !accepted { responder.respond(.shuttingDown) }
            return answerOrSuspend(context, connection: connection)
        case .stream(let status, let headers, let start):
            return startStream(context, connection: connection, status: status, headers: headers, start: start)
        }
    }

    private func answerOrSuspend(_ context: RequestContext, connection: OpaquePointer) -> MHD_Result {
        guard let responder = context.responder else { return .NO }
        switch responder.takeResponseOrSuspend() {
        case .response(let response):
            context.phase = .done
            return queue(response, on: connection)
        case .suspended:
            return .YES
        case .ended:
            return .NO
        }
    }

    private func startStream(
        _ context: RequestContext, connection: OpaquePointer, status: Int, headers: [(String, String)],
        start: @Sendable (HTTPStream) -> Void
    ) -> MHD_Result {
        let stream = HTTPStream(connection: MHDConnection(raw: connection))
        let streamContext = Unmanaged.passRetained(stream).toOpaque()
        // MHD_SIZE_UNKNOWN (not imported): chunked encoding on HTTP/1.1.
        guard
            let response = MHD_create_response_from_callback(
                UInt64.max, 4096, Callbacks.streamRead, streamContext, Callbacks.streamFree)
        else {
            Unmanaged<HTTPStream>.fromOpaque(streamContext).release()
            log("error", "could not create a streamed response")
            return .NO
        }
        addHeaders(headers, to: response)
        let queued = MHD_queue_response(connection, statusCode(status), response)
        MHD_destroy_response(response)  // MHD keeps its own reference; the stream is freed with it
        guard queued == .YES else {
            log("error", "could not queue a streamed response with status \(status)")
            return .NO
        }
        context.stream = stream
        context.phase = .done
        let accepted = register(stream)
        start(stream)
        if !accepted { stream.close() }
        return .YES
    }

    /// Queues a complete response (MHD copies the body).
    func queue(_ response: HTTPResponse, on connection: OpaquePointer) -> MHD_Result {
        let count = response.body.count
        let created: OpaquePointer? =
            count == 0
            ? MHD_create_response_from_buffer(0, nil, .RESPMEM_PERSISTENT)
            : response.body.withUnsafeBytes { body in
                MHD_create_response_from_buffer(count, UnsafeMutableRawPointer(mutating: body.baseAddress), .RESPMEM_MUST_COPY)
            }
        guard let mhdResponse = created else {
            log("error", "could not create a response of \(count) bytes")
            return .NO
        }
        if !response.headers.isEmpty { addHeaders(response.headers, to: mhdResponse) }
        let queued = MHD_queue_response(connection, statusCode(response.status), mhdResponse)
        MHD_destroy_response(mhdResponse)
        if queued != .YES { log("error", "could not queue a response with status \(response.status)") }
        return queued
    }

    private func addHeaders(_ headers: [(String, String)], to response: OpaquePointer) {
        for (name, value) in headers {
            let added = name.withCString { name in
                value.withCString { value in MHD_add_response_header(response, name, value) }
            }
            // MHD refuses e.g. values with CR/LF and a manual Content-Length.
            if added != .YES { log("warning", "response header \(name) was refused") }
        }
    }

    private func statusCode(_ status: Int) -> UInt32 {
        (100...999).contains(status) ? UInt32(status) : 500
    }
}
