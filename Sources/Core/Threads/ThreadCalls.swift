import CShims

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The Threads layer's system calls, and the one place where their errno
/// values are sorted into what Spindle does about them:
/// - retry: EINTR (the C shims retry their own reads; nothing here sleeps);
/// - throw: the environment said no (EPERM, EACCES, EAGAIN, ENOMEM, ESRCH for
///   a thread that has exited, EINVAL for a CPU set the process may not use);
/// - stop with a message naming the call: EFAULT, EBADF, and EINVAL where
///   Spindle validated the argument first, i.e. a bug in Spindle.
enum ThreadCalls {
    /// What the caller was doing, so that an errno can be told apart (EINVAL
    /// from `pthread_create` means a rejected stack or CPU set depending on
    /// which was given).
    enum Operation {
        case create(stackSize: Int?, cpus: [Int]?, policy: String?)
        case setAffinity(tid: Int32, cpus: [Int])
        case getAffinity(tid: Int32)
        case setNice(tid: Int32, nice: Int32)
        case getNice(tid: Int32)
        case setScheduling(tid: Int32, policy: String)
        case getScheduling(tid: Int32)
        case preferNode(node: Int32)
        case allocateOnNode(node: Int32, bytes: Int)
        case setName

        var call: String {
            switch self {
            case .create: "pthread_create"
            case .setAffinity: "sched_setaffinity"
            case .getAffinity: "sched_getaffinity"
            case .setNice: "setpriority"
            case .getNice: "getpriority"
            case .setScheduling: "sched_setscheduler"
            case .getScheduling: "sched_getscheduler"
            case .preferNode: "set_mempolicy(MPOL_PREFERRED)"
            case .allocateOnNode: "numa_alloc_onnode"
            case .setName: "prctl(PR_SET_NAME)"
            }
        }

        /// Words for a permission error: what was asked for.
        var request: String {
            switch self {
            case .create(_, _, let policy): "create a thread" + (policy.map { " with \($0)" } ?? "")
            case .setAffinity(let tid, let cpus): "set the CPU affinity of thread \(tid) to \(CPUList.format(cpus))"
            case .getAffinity(let tid): "read the CPU affinity of thread \(tid)"
            case .setNice(let tid, let nice): "set nice \(nice) on thread \(tid)"
            case .getNice(let tid): "read the nice value of thread \(tid)"
            case .setScheduling(let tid, let policy): "set \(policy) on thread \(tid)"
            case .getScheduling(let tid): "read the scheduling policy of thread \(tid)"
            case .preferNode(let node): "prefer memory of NUMA node \(node)"
            case .allocateOnNode(let node, let bytes): "allocate \(bytes) bytes on NUMA node \(node)"
            case .setName: "set the thread name"
            }
        }
    }

    /// Sorts a failed call's errno (positive) into an error or a stop.
    static func failure(_ code: Int32, _ operation: Operation) -> NativeThreadError {
        switch code {
        case EPERM, EACCES:
            return .permissionDenied(operation: operation.request, code: code)
        case ESRCH:
            switch operation {
            case .setAffinity(let tid, _), .getAffinity(let tid), .setNice(let tid, _), .getNice(let tid),
                 .setScheduling(let tid, _), .getScheduling(let tid):
                return .threadExited(id: tid)
            default:
                break
            }
        case EINVAL:
            switch operation {
            case .create(_, let cpus?, _), .setAffinity(_, let cpus):
                // Validated against the online CPUs first, so the kernel's
                // EINVAL means none of them is in this process's cpuset.
                return .cpusNotAllowed(requested: cpus)
            case .create(let stackSize?, nil, _):
                return .stackSizeRejected(requested: stackSize)
            default:
                break
            }
        case EAGAIN, ENOMEM, ENOSPC, ENOSYS, EOPNOTSUPP:
            return .systemCall(SystemCallError(call: operation.call, code: code))
        default:
            break
        }
        // EFAULT, EBADF, or EINVAL on arguments Spindle checked: a bug here.
        misuse("\(operation.call) failed unexpectedly while trying to \(operation.request): \(errnoDescription(code))")
    }

    // MARK: Affinity

    /// The CPUs thread `tid` (0: the caller) may run on.
    static func affinity(of tid: Int32) throws(NativeThreadError) -> Set<Int> {
        // Enough words for every configured CPU, and at least cpu_set_t's 1024 bits.
        let words = max(16, (Int(cshims_cpu_count_configured()) + 63) / 64)
        var mask = [UInt64](repeating: 0, count: words)
        let rc = cshims_affinity_get(tid, &mask, words)
        if rc < 0 { throw failure(-rc, .getAffinity(tid: tid)) }
        var cpus: Set<Int> = []
        for (index, word) in mask.enumerated() where word != 0 {
            for bit in 0..<64 where word & (1 << UInt64(bit)) != 0 {
                cpus.insert(index * 64 + bit)
            }
        }
        return cpus
    }

    static func setAffinity(of tid: Int32, to cpus: [Int]) throws(NativeThreadError) {
        let mask = Topology.mask(of: cpus)
        let rc = cshims_affinity_set(tid, mask, mask.count)
        if rc < 0 { throw failure(-rc, .setAffinity(tid: tid, cpus: cpus)) }
    }

    // MARK: Scheduling

    static func setNice(of tid: Int32, to nice: Int32) throws(NativeThreadError) {
        let rc = cshims_thread_set_nice(tid, nice)
        if rc < 0 { throw failure(-rc, .setNice(tid: tid, nice: nice)) }
    }

    static func nice(of tid: Int32) throws(NativeThreadError) -> Int32 {
        var nice: Int32 = 0
        let rc = cshims_thread_get_nice(tid, &nice)
        if rc < 0 { throw failure(-rc, .getNice(tid: tid)) }
        return nice
    }

    static func setScheduling(of tid: Int32, policy: Int32, priority: Int32, describedAs name: String) throws(NativeThreadError) {
        let rc = cshims_thread_sched_set(tid, policy, priority)
        if rc < 0 { throw failure(-rc, .setScheduling(tid: tid, policy: name)) }
    }

    static func scheduling(of tid: Int32) throws(NativeThreadError) -> (policy: Int32, priority: Int32) {
        var policy: Int32 = 0
        var priority: Int32 = 0
        let rc = cshims_thread_sched_get(tid, &policy, &priority)
        if rc < 0 { throw failure(-rc, .getScheduling(tid: tid)) }
        return (policy, priority)
    }

    // MARK: NUMA

    static func preferNode(_ node: Int32) throws(NativeThreadError) {
        let rc = cshims_numa_prefer_node(node)
        if rc < 0 { throw failure(-rc, .preferNode(node: node)) }
    }

    static func allocate(byteCount: Int, onNode node: Int32) throws(NativeThreadError) -> UnsafeMutableRawPointer {
        var error: Int32 = 0
        guard let memory = cshims_numa_alloc_on_node(byteCount, node, &error) else {
            throw failure(error < 0 ? -error : ENOMEM, .allocateOnNode(node: node, bytes: byteCount))
        }
        return memory
    }

    // MARK: Names

    /// The calling thread's kernel name.
    static func nameOfCallingThread() -> String? {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 32) { buffer in
            guard cshims_thread_get_name_self(buffer.baseAddress!, buffer.count) == 0 else { return nil }
            return String(cString: buffer.baseAddress!)
        }
    }

    /// The kernel name of thread `tid` of this process, or nil if it has exited.
    static func name(of tid: Int32) -> String? {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 32) { buffer in
            guard cshims_thread_get_name(tid, buffer.baseAddress!, buffer.count) == 0 else { return nil }
            return String(cString: buffer.baseAddress!)
        }
    }

    /// Names the calling thread; the name was checked (length, no NUL).
    static func setNameOfCallingThread(_ name: String) {
        let rc = name.withCString { cshims_thread_set_name_self($0) }
        if rc < 0 { _ = failure(-rc, .setName) }
    }

    // MARK: Files

    /// The contents of a small text file (sysfs, procfs), or nil.
    static func readSmallFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return nil
            }
            if n == 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
