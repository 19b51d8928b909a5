/// The Swift runtime's switch that stops counting an object's references.
/// Exported by libswiftCore since Swift 5.9 and used by the standard
/// library for its statically allocated objects; not public API (hence the
/// symbol name), like the executor hooks `SpindleConcurrency` uses. Swift
/// calling convention, one pointer argument.
@_silgen_name("_swift_stdlib_immortalize")
private func swiftRuntimeImmortalize(_ object: UnsafeMutableRawPointer)

/// Makes `object` immortal: from now on a retain or release of it reads its
/// reference count and writes nothing. For objects that live for the whole
/// process and that every thread retains: the global queues, the main
/// queue, the worker pools. Otherwise each `WorkQueue.global()` (which
/// returns its queue retained, as every Swift function returns a class
/// reference) writes the queue's header, and two workers submitting at once
/// pass that cache line back and forth (in a skynet profile the load of a
/// field beside the header was 92% of `async`'s own time). Such an object is
/// never freed, which for these it never was. Returns `object`.
func makeImmortal<Object: AnyObject>(_ object: Object) -> Object {
    swiftRuntimeImmortalize(Unmanaged.passUnretained(object).toOpaque())
    return object
}
