import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// TEMPORARY until the outbound client lands.
struct FoundationWebhookTransport: WebhookTransport {
    let session: URLSession
    init() {
        let config = URLSessionConfiguration.ephemeral
        config.timeoutIntervalForRequest = 5
        session = URLSession(configuration: config)
    }
    func post(url: String, body: [UInt8], headers: [(String, String)], timeout: Double, _ done: @escaping @Sendable (Bool) -> Void) {
        guard let target = URL(string: url) else { done(false); return }
        var request = URLRequest(url: target)
        request.httpMethod = "POST"
        for (k, v) in headers { request.setValue(v, forHTTPHeaderField: k) }
        request.httpBody = Data(body)
        session.dataTask(with: request) { _, response, _ in
            done((response as? HTTPURLResponse).map { (200..<300).contains($0.statusCode) } ?? false)
        }.resume()
    }
}
