/// The server's request path without a connection, for in-process tests and fuzz targets:
/// the same handler, fed an `HTTPRequest` built elsewhere (never by MHD).
extension HTTPServer {
    /// What the bridge does once a request is fully received: refuses a body over the limit
    /// with 413 (`declaredBodyBytes` is the `Content-Length`, checked before the body is read,
    /// as the bridge does), otherwise runs the handler (a `.routed` result unwrapped); an error it throws becomes its
    /// problem, or 500.
    /// Needs no `start()`; binds nothing.
    package func handleDetached(_ request: HTTPRequest, declaredBodyBytes: Int? = nil) -> HTTPHandlerResult {
        let limit = core.maxBodyBytes
        if let declared = declaredBodyBytes, declared > limit {
            return .response(.payloadTooLarge(bodyBytes: declared, limit: limit))
        }
        if request.body.count > limit {
            return .response(.payloadTooLarge(bodyBytes: request.body.count, limit: limit))
        }
        do {
            var result = try core.handler(request)
            while case let .routed(_, inner) = result { result = inner }
            return result
        } catch {
            return .response(Problem.from(error, requestID: request.id).response)
        }
    }
}
