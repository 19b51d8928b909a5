// Immortal objects, through a private entry point of the Swift runtime, kept
// behind a compiler-version check so that a toolchain that drops or renames
// it cannot break the build or the link of anyone who depends on Spindle.
//
// `_swift_stdlib_immortalize` is exported by libswiftCore from Swift 5.9 on
// and used by the standard library for its statically allocated objects; it
// is not public API (hence the symbol name). It is bound only for the
// compilers it is known to be in (5.9 through 6.3; raise the bound after
// checking a new release exports it with the same signature:
// `nm -D libswiftCore.so | grep _swift_stdlib_immortalize`), and not at all
// when the build defines `SPINDLE_NO_PRIVATE_RUNTIME`
// (`swift build -Xswiftc -DSPINDLE_NO_PRIVATE_RUNTIME`), which is how the
// fallback is built and tested here.
//
// The fallback leaves the objects mortal: they are still never freed (each
// is held by a `static let` for the life of the process), but every retain
// and release of them writes their reference count again. What that costs:
// each `WorkQueue.global()` (returned retained, as every Swift function
// returns a class reference) and each worker's use of its pool, poller and
// monitor is an atomic read-modify-write on the object's header; a single
// thread pays a few nanoseconds per submission (an uncontended locked
// add), but workers submitting at once on several cores pass that cache
// line back and forth, and the fan-out rows this was added for (skynet,
// nested submission, where `async`'s own time was mostly that line: 92% in
// the profile) lose what immortality won there. Nothing else changes:
// behaviour and ordering are the same, only that contention returns.
#if compiler(>=5.9) && !compiler(>=6.4) && !SPINDLE_NO_PRIVATE_RUNTIME
/// The Swift runtime's switch that stops counting an object's references.
/// Swift calling convention, one pointer argument.
@_silgen_name("_swift_stdlib_immortalize")
private func swiftRuntimeImmortalize(_ object: UnsafeMutableRawPointer)

/// Whether `makeImmortal` really makes objects immortal in this build (the
/// runtime entry point is bound), or leaves them mortal (the fallback).
package let immortalObjectsAreSupported = true

/// Makes `object` immortal: from now on a retain or release of it reads its
/// reference count and writes nothing. For objects that live for the whole
/// process and that every thread retains: the global queues, the main
/// queue, the worker pools. Otherwise each `WorkQueue.global()` (which
/// returns its queue retained, as every Swift function returns a class
/// reference) writes the queue's header, and two workers submitting at once
/// pass that cache line back and forth (in a skynet profile the load of a
/// field beside the header was 92% of `async`'s own time). Such an object is
/// never freed, which for these it never was. Returns `object`.
package func makeImmortal<Object: AnyObject>(_ object: Object) -> Object {
    swiftRuntimeImmortalize(Unmanaged.passUnretained(object).toOpaque())
    return object
}
#else
/// Whether `makeImmortal` really makes objects immortal in this build: not
/// in this one (an unknown compiler, or `SPINDLE_NO_PRIVATE_RUNTIME`).
package let immortalObjectsAreSupported = false

/// The fallback for toolchains where the runtime's entry point is not known
/// to exist: returns `object` unchanged, still counted (see the top of this
/// file for what that costs). The callers hold it for the life of the
/// process anyway.
package func makeImmortal<Object: AnyObject>(_ object: Object) -> Object {
    object
}
#endif
