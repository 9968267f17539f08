@main enum Placeholder { static func main() {} }
