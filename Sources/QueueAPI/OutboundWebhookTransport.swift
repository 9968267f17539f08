import OutboundHTTP

/// Webhook POSTs through the libcurl-based outbound client: whatever a receiver answers
/// (redirects, garbage, endless bodies) is an error value, never a trap. Redirects are
/// followed by `RedirectPolicy` (at most 5, http/https only); 4 KiB of the answer is read.
package struct OutboundWebhookTransport: WebhookTransport {
    package init() {

    }

    /// One client (one thread running curl's multi loop) for every webhook.
    let client = OutboundHTTPClient()

    package func post(url: String, body: [UInt8], headers: [(String, String)], timeout: Double, _ done: @escaping @Sendable (String?) -> Void)
        -> @Sendable () -> Void
    {
        let request = OutboundRequest(
            method: "POST", url: url, headers: headers, body: body, timeout: timeout,
            maxResponseBytes: 4096, maxHeaderBytes: 16 * 1024)
        let task = client.send(request) { result in
            switch result {
            case let .success(response): done((200..<300).contains(response.status) ? nil : "the receiver answered \(response.status)")
            case let .failure(error): done("\(error.type): \(error.detail)")
            }
        }
        return { task.cancel() }
    }
}
