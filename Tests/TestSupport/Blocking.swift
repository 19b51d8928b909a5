/// Runs `body`, a call that blocks its thread, from async code that may
/// block it on purpose: an exit test's body (a child process with nothing
/// else to run) or a test that measures a blocked thread. The closure is
/// synchronous, so the `noasync` diagnostic of the call inside it does not
/// apply; anywhere else, prefer the call's async form.
@discardableResult
public func blocking<T>(_ body: () throws -> T) rethrows -> T {
    try body()
}
