internal import CMicroHTTPD
import Glibc

/// libmicrohttpd's callbacks. They are C function pointers that capture nothing; each receives the
/// `ServerCore`, the connection's `ConnectionState` or an `HTTPStream` as a context pointer.
///
/// They live at type scope in a non-main file on purpose: a closure that Swift 6 considers
/// main-actor isolated gets an isolation check that traps when MHD calls it on its own threads.
enum Callbacks {
    /// MHD_OPTION_NOTIFY_CONNECTION: creates the connection's context when it opens and releases it
    /// when it closes, finishing a request that MHD never reported as completed.
    static let connectionChanged: MHD_NotifyConnectionCallback = { cls, _, socketContext, code in
        guard let cls, let socketContext else { return }
        let server = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
        if code == .CONNECTION_NOTIFY_STARTED {
            socketContext.pointee = UnsafeMutableRawPointer(ConnectionState.allocate())
            server.openConnections.add(1, ordering: .relaxed)
            return
        }
        guard let raw = socketContext.pointee else { return }
        socketContext.pointee = nil
        server.openConnections.subtract(1, ordering: .relaxed)
        let context = raw.assumingMemoryBound(to: ConnectionState.self)
        server.finishRequest(context)
        ConnectionState.free(context)
    }

    /// MHD_OPTION_URI_LOG_CALLBACK: called once per request, before the headers, with the request
    /// target as sent (the only place MHD shows the path before percent-decoding it). Its result
    /// becomes the request's `con_cls`: the connection's context (not retained: it lives as long
    /// as the connection).
    static let requestStarted:
        @convention(c) (
            UnsafeMutableRawPointer?, UnsafePointer<CChar>?, OpaquePointer?
        ) -> UnsafeMutableRawPointer? = { cls, uri, connection in
            guard let cls, let connection, let raw = CMicroHTTPD_connection_socket_context(connection) else { return nil }
            let server = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
            let context = raw.assumingMemoryBound(to: ConnectionState.self)
            server.finishRequest(context)  // not expected: the previous request completed
            context.pointee.beginRequest(path: uri.map(rawPath) ?? "/", targetBytes: uri.map { strlen($0) } ?? 0)
            server.inFlight.add(1, ordering: .relaxed)
            return raw
        }

    /// MHD_OPTION_NOTIFY_COMPLETED: the request is over (answered, failed, client gone or daemon
    /// stopping). Tells its responder or stream.
    static let requestCompleted: MHD_RequestCompletedCallback = { cls, _, contextSlot, _ in
        guard let cls, let contextSlot, let raw = contextSlot.pointee else { return }
        contextSlot.pointee = nil
        Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
            .finishRequest(raw.assumingMemoryBound(to: ConnectionState.self))
    }

    /// The access handler: MHD calls it once the headers are in, once per body chunk, and a final
    /// time with no data, which is when the Swift handler runs (and again after a resume).
    static let access: MHD_AccessHandlerCallback = {
        cls, connection, url, method, _, uploadData, uploadDataSize, contextSlot in
        guard let cls, let connection, let uploadDataSize, let contextSlot else { return .NO }
        let server = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
        guard let raw = contextSlot.pointee ?? CMicroHTTPD_connection_socket_context(connection) else { return .NO }
        contextSlot.pointee = raw
        let context = raw.assumingMemoryBound(to: ConnectionState.self)
        if !context.pointee.requestOpen {
            // Not expected (the URI log callback runs first), but keep the invariant.
            context.pointee.beginRequest(path: url.map { String(cString: $0) } ?? "/", targetBytes: url.map { strlen($0) } ?? 0)
            server.inFlight.add(1, ordering: .relaxed)
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

    /// Collects query arguments (already percent-decoded by MHD); the last repeat wins, and the
    /// names that repeat are kept.
    static let collectArgument: MHD_KeyValueIteratorN = { cls, _, key, keySize, value, valueSize in
        guard let cls, let key else { return .YES }
        let query = cls.assumingMemoryBound(to: QueryArguments.self)
        let name = string(from: key, count: keySize)
        if query.pointee.values.updateValue(value.map { string(from: $0, count: valueSize) } ?? "", forKey: name) != nil,
            query.pointee.repeated.count < 64, !query.pointee.repeated.contains(name)
        {
            query.pointee.repeated.append(name)
        }
        return .YES
    }
}

/// What ``Callbacks/collectArgument`` fills: the arguments, and the names given more than once
/// (at most 64 kept: enough to name one).
struct QueryArguments {
    var values: [String: String]
    var repeated: [String] = []
}

@inline(__always)
private func string(from bytes: UnsafePointer<CChar>, count: Int) -> String {
    String(decoding: UnsafeRawBufferPointer(start: bytes, count: count), as: UTF8.self)
}

/// The method as a Swift string; the common ones without decoding.
private func methodName(_ method: UnsafePointer<CChar>) -> String {
    switch (method[0], method[1]) {
    case (0x47, 0x45) where method[2] == 0x54 && method[3] == 0: return "GET"
    case (0x50, 0x4F) where method[2] == 0x53 && method[3] == 0x54 && method[4] == 0: return "POST"
    case (0x50, 0x55) where method[2] == 0x54 && method[3] == 0: return "PUT"
    default: return String(cString: method)
    }
}

/// The request target up to the query string, as sent.
private func rawPath(_ uri: UnsafePointer<CChar>) -> String {
    var length = 0
    while uri[length] != 0 && uri[length] != 0x3F /* ? */ { length += 1 }
    return string(from: uri, count: length)
}

// MARK: - Request handling (server threads)

extension ServerCore {
    /// Ends the connection's current request, if one is open: tells its responder or stream.
    func finishRequest(_ context: ConnectionContext) {
        guard context.pointee.requestOpen else { return }
        context.pointee.requestOpen = false
        inFlight.subtract(1, ordering: .releasing)
        let responder = context.pointee.responder.take()
        let stream = context.pointee.stream.take()
        context.pointee.headers = [:]
        context.pointee.body = []
        if responder == nil && stream == nil { return }
        responder?.requestEnded()
        stream?.finish(connectionGone: true)
        unregister(responder: responder, stream: stream)
    }

    func handle(
        _ context: ConnectionContext, connection: OpaquePointer, method: UnsafePointer<CChar>?,
        uploadData: UnsafePointer<CChar>?, uploadDataSize: UnsafeMutablePointer<Int>
    ) -> MHD_Result {
        switch context.pointee.phase {
        case .headers:
            if refusing.load(ordering: .relaxed) {
                // Shutting down: nothing new starts; the client may retry elsewhere or later.
                context.pointee.phase = .done
                return queue(.refusedUnstarted, on: connection, context: context)
            }
            context.pointee.phase = .body
            let headers = Self.values(of: .HEADER_KIND, on: connection, iterator: Callbacks.collectHeader)
            // The request line and header fields as sent (": " and CRLF per field): over the
            // limit is 431, before the body is read.
            var headerBytes = context.pointee.targetBytes + 16
            for (name, value) in headers { headerBytes &+= name.utf8.count &+ value.utf8.count &+ 4 }
            if headerBytes > maxHeaderBytes {
                context.pointee.phase = .done
                return queue(.headersTooLarge(bytes: headerBytes, limit: maxHeaderBytes), on: connection, context: context)
            }
            // A Content-Length that is not one plain number (repeated, signed, hex, overflowing),
            // or one next to Transfer-Encoding, is how requests get smuggled past proxies: refuse.
            if let declared = headers["content-length"],
                declared.isEmpty || declared.utf8.count > 19 || !declared.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 })
                    || headers["transfer-encoding"] != nil
            {
                context.pointee.phase = .done
                return queue(.badFraming, on: connection, context: context)
            }
            if let headCheck {
                // Decided on the head alone, before a byte of the body is read: a caller without
                // the right token cannot make the server hold a body for it.
                let head = HTTPRequest(method: method.map(methodName) ?? "GET", path: context.pointee.path, headers: headers)
                if let refusal = headCheck(head) {
                    context.pointee.phase = .done
                    return queue(refusal.response, on: connection, context: context, route: refusal.route)
                }
            }
            if let declared = headers["content-length"], case let length = Int(declared) ?? Int.max, length > 0 {
                if length > maxBodyBytes {
                    // Answering before the body is read makes MHD skip it and close the connection;
                    // with `Expect: 100-continue` the client never sends it.
                    context.pointee.phase = .done
                    return queue(.payloadTooLarge(bodyBytes: length, limit: maxBodyBytes), on: connection, context: context)
                }
                // Capped: a declared length is a promise, not memory we owe before the bytes arrive.
                context.pointee.body.reserveCapacity(min(length, 64 * 1024))
            }
            context.pointee.headers = headers
            return .YES

        case .body:
            let size = uploadDataSize.pointee
            if size > 0 {
                // A body chunk; MHD cannot queue a response now, only consume the data.
                uploadDataSize.pointee = 0
                context.pointee.received += size
                if !context.pointee.tooLarge {
                    if context.pointee.received > maxBodyBytes {
                        context.pointee.tooLarge = true
                        context.pointee.body = []
                    } else if let uploadData {
                        context.pointee.body.append(contentsOf: UnsafeRawBufferPointer(start: uploadData, count: size))
                    }
                }
                if context.pointee.received > discardLimit {
                    log("warning", "dropping a connection whose request body passed \(discardLimit) bytes")
                    return .NO
                }
                return .YES
            }
            context.pointee.phase = .done
            if context.pointee.tooLarge {
                return queue(.payloadTooLarge(bodyBytes: context.pointee.received, limit: maxBodyBytes), on: connection, context: context)
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

    /// Header fields as a dictionary, sized once (growing a dictionary goes through
    /// unspecialized standard-library code, measurably slower per request).
    private static func values(
        of kind: MHD_ValueKind, on connection: OpaquePointer, iterator: MHD_KeyValueIteratorN
    ) -> [String: String] {
        let count = MHD_get_connection_values_n(connection, kind, nil, nil)
        guard count > 0 else { return [:] }
        var values = [String: String](minimumCapacity: Int(count))
        withUnsafeMutablePointer(to: &values) { values in
            _ = MHD_get_connection_values_n(connection, kind, iterator, values)
        }
        return values
    }

    /// The query arguments, the dictionary sized once (growing a dictionary goes through
    /// unspecialized standard-library code, measurably slower per request).
    private static func queryArguments(on connection: OpaquePointer) -> QueryArguments {
        let count = MHD_get_connection_values_n(connection, .GET_ARGUMENT_KIND, nil, nil)
        guard count > 0 else { return QueryArguments(values: [:]) }
        var arguments = QueryArguments(values: [String: String](minimumCapacity: Int(count)))
        withUnsafeMutablePointer(to: &arguments) { arguments in
            _ = MHD_get_connection_values_n(connection, .GET_ARGUMENT_KIND, Callbacks.collectArgument, arguments)
        }
        return arguments
    }

    private func runHandler(
        _ context: ConnectionContext, connection: OpaquePointer, method: UnsafePointer<CChar>?
    ) -> MHD_Result {
        let arguments = Self.queryArguments(on: connection)
        let request = HTTPRequest(
            id: lastRequestID.add(1, ordering: .relaxed).newValue,
            method: method.map(methodName) ?? "GET",
            path: context.pointee.path,
            query: arguments.values,
            repeatedQueryNames: arguments.repeated,
            headers: context.pointee.headers,
            body: context.pointee.body
        )
        context.pointee.body = []
        var result: HTTPHandlerResult
        do {
            result = try handler(request)
        } catch {
            if !(error is any ProblemConvertible) {
                log("error", "request \(request.id) \(request.method) \(request.path) failed: \(String(describing: error))")
            }
            return queue(Problem.from(error, requestID: request.id).response, on: connection, context: context, route: nil)
        }
        if case let .routed(route, inner) = result {
            context.pointee.route = route
            result = inner
        }
        let route = context.pointee.route
        switch result {
        case .response(let response):
            return queue(response, on: connection, context: context, route: route)
        case .routed(_, let inner):
            // One level of routing is all a handler gives; an answer nested deeper is still sent.
            if case let .response(response) = inner { return queue(response, on: connection, context: context, route: route) }
            return queue(Problem.internalError(requestID: request.id).response, on: connection, context: context, route: route)
        case .deferred(let body):
            let responder = HTTPResponder(connection: MHDConnection(raw: connection))
            context.pointee.responder = responder
            context.pointee.phase = .waiting
            body(responder)
            // An answer already on its way (a change waiting for its commit) is registered even
            // while stopping, so shutdown waits for it instead of answering 503.
            let accepted = register(responder, force: responder.keepsThroughShutdown)
            if !accepted { responder.respond(.shuttingDown) }
            return answerOrSuspend(context, connection: connection)
        case .stream(let status, let headers, let start):
            return startStream(context, connection: connection, status: status, headers: headers, start: start)
        }
    }

    private func answerOrSuspend(_ context: ConnectionContext, connection: OpaquePointer) -> MHD_Result {
        guard let responder = context.pointee.responder else { return .NO }
        switch responder.takeResponseOrSuspend() {
        case .response(let response):
            context.pointee.phase = .done
            return queue(response, on: connection, context: context, route: context.pointee.route)
        case .suspended:
            return .YES
        case .ended:
            return .NO
        }
    }

    private func startStream(
        _ context: ConnectionContext, connection: OpaquePointer, status: Int, headers: [(String, String)],
        start: @Sendable (HTTPStream) -> Void
    ) -> MHD_Result {
        let stream = HTTPStream(connection: MHDConnection(raw: connection))
        // A fixed 64 KiB send buffer (Linux doubles it) instead of autotuning up to megabytes: a
        // stream's client that stops reading holds little kernel memory and shows as stalled soon.
        let fd = CMicroHTTPD_connection_fd(connection)
        if fd >= 0 {
            var size: Int32 = 64 * 1024
            _ = setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
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
        context.pointee.stream = stream
        context.pointee.phase = .done
        responseObserver?(context.pointee.route, status, context.pointee.elapsed())
        let accepted = register(stream)
        start(stream)
        if !accepted { stream.close() }
        return .YES
    }

    /// Queues a complete response (MHD copies the body) and tells `responseObserver`, with the
    /// time since the request line arrived (for a deferred answer: until it was finally queued).
    func queue(_ response: HTTPResponse, on connection: OpaquePointer, context: ConnectionContext, route: String? = nil) -> MHD_Result {
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
        if queued == .YES, let responseObserver { responseObserver(route, response.status, context.pointee.elapsed()) }
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
