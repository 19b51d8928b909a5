// The peers of Spindle's locks, as the benchmarks hold them.
//
// pthread objects must not move once initialized, so each lives in memory of
// its own (BenchSupport's allocateOnOwnCacheLine: alone on a 128-byte line,
// never freed). So does Synchronization.Mutex, a ~Copyable value that would
// otherwise live wherever its owner does. Foundation's and NIO's locks, and
// Spindle's, allocate their own storage when created; that is part of what is
// compared (see the lock.create groups).

import BenchSupport
import Foundation
import NIOConcurrencyHelpers
import Spindle
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// MARK: - One interface for the contended groups

/// A lock as the contended groups drive it: run `body` holding it.
///
/// Each implementation is a small value; the worker loop is generic over it,
/// so it is specialized for each and the lock's own fast path is inlined
/// into the loop as it would be in a caller's code.
protocol ContendedLock {
    func locked<Result>(_ body: () -> Result) -> Result
}

extension Spindle.Lock: ContendedLock {
    func locked<Result>(_ body: () -> Result) -> Result {
        lock()
        defer { unlock() }
        return body()
    }
}

extension NSLock: ContendedLock {
    func locked<Result>(_ body: () -> Result) -> Result {
        lock()
        defer { unlock() }
        return body()
    }
}

extension NIOLock: ContendedLock {
    func locked<Result>(_ body: () -> Result) -> Result {
        lock()
        defer { unlock() }
        return body()
    }
}

// MARK: - pthread

/// A `pthread_mutex_t` of the given type (nil: the default, PTHREAD_MUTEX_TIMED_NP).
struct PthreadMutex: ContendedLock, @unchecked Sendable {
    // @unchecked: the mutex is only used through pthread calls.
    let mutex: UnsafeMutablePointer<pthread_mutex_t>

    init(type: Int32? = nil) {
        mutex = allocateOnOwnCacheLine(pthread_mutex_t())
        var attributes = pthread_mutexattr_t()
        precondition(pthread_mutexattr_init(&attributes) == 0, "pthread_mutexattr_init failed")
        if let type {
            precondition(pthread_mutexattr_settype(&attributes, type) == 0, "pthread_mutexattr_settype(\(type)) failed")
        }
        precondition(pthread_mutex_init(mutex, &attributes) == 0, "pthread_mutex_init failed")
        pthread_mutexattr_destroy(&attributes)
    }

    /// glibc's adaptive mutex: spins a bounded, self-tuning number of rounds
    /// before sleeping (the issue names it the best peer at 2 threads).
    static func adaptive() -> PthreadMutex { PthreadMutex(type: Int32(PTHREAD_MUTEX_ADAPTIVE_NP)) }

    /// A recursive `pthread_mutex_t`, the objc-less recursive lock.
    static func recursive() -> PthreadMutex { PthreadMutex(type: Int32(PTHREAD_MUTEX_RECURSIVE)) }

    func lock() { pthread_mutex_lock(mutex) }
    func unlock() { pthread_mutex_unlock(mutex) }

    func locked<Result>(_ body: () -> Result) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return body()
    }
}

/// A `pthread_rwlock_t` with the default attributes (glibc: prefers readers).
struct PthreadReadWriteLock: @unchecked Sendable {
    // @unchecked: the lock is only used through pthread calls.
    let rwlock: UnsafeMutablePointer<pthread_rwlock_t>

    init() {
        rwlock = allocateOnOwnCacheLine(pthread_rwlock_t())
        precondition(pthread_rwlock_init(rwlock, nil) == 0, "pthread_rwlock_init failed")
    }
}

/// A `pthread_spinlock_t`, private to the process.
struct PthreadSpinLock: @unchecked Sendable {
    // @unchecked: the lock is only used through pthread calls.
    let spinlock: UnsafeMutablePointer<pthread_spinlock_t>

    init() {
        spinlock = allocateOnOwnCacheLine(pthread_spinlock_t())
        precondition(pthread_spin_init(spinlock, Int32(PTHREAD_PROCESS_PRIVATE)) == 0, "pthread_spin_init failed")
    }
}

// MARK: - Synchronization.Mutex

/// A `Mutex<Void>` on a line of its own. Mutex offers only closures
/// (`withLock`); that is how it is used here and in user code.
struct SynchronizationMutex: ContendedLock, @unchecked Sendable {
    // @unchecked: the pointee is a Mutex, used only through withLock.
    let mutex: UnsafeMutablePointer<Mutex<Void>>

    init() { mutex = allocateOnOwnCacheLine(Mutex(())) }

    func locked<Result>(_ body: () -> Result) -> Result {
        mutex.pointee.withLock { _ in body() }
    }
}

/// A Mutex owned by an object: how a Mutex reaches the heap (it is a value;
/// a class that needs one stores it as a property). The lock.create rows
/// measure the smallest such owner.
final class MutexOwner: Sendable {
    let mutex = Mutex(())
}

// MARK: - Once's peers

/// What each one-time initialization of the once groups computes, so the
/// optimizer cannot fold it: the process id.
@inline(never)
func onceInitialValue() -> Int { Int(getpid()) }

/// A Swift lazy global: its first access runs the initializer (through
/// swift_once); every access checks that it has.
let lazyGlobalValue: Int = onceInitialValue()

/// The value pthread_once initializes; written once, inside the once routine.
nonisolated(unsafe) var pthreadOnceValue = 0
