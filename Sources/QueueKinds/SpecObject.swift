import QueueEngine

/// The checks every object-shaped kind spec starts with: present, an object, no field
/// outside `fields`. Returns the spec; the messages show `shape`.
func specObject(_ spec: JSONValue?, kind: String, shape: String, fields: [String]) throws(EngineError) -> JSONValue {
    guard let spec else { throw .invalidArgument(field: "spec", detail: "kind \(kind) needs a spec \(shape)") }
    guard case let .object(members) = spec else {
        throw .invalidArgument(field: "spec", detail: "must be an object \(shape); got \(spec.typeName)")
    }
    for (k, _) in members where !fields.contains(k) {
        throw .invalidArgument(field: "spec.\(k)", detail: "unknown field; kind \(kind) allows \(fields.joined(separator: ", "))")
    }
    return spec
}
