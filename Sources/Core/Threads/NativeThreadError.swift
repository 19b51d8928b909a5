/// Why Spindle could not create, configure or place a thread.
///
/// Two kinds of failure end up here, and both are thrown, never turned into a
/// crash and never corrected silently:
/// - a value the platform cannot honour (a stack below the minimum, a CPU that
///   is not online, a name longer than Linux keeps), found by
///   `NativeThread.Attributes.validate()` before any system call is made;
/// - a refusal by the environment (no permission for a real-time policy, the
///   process's thread limit reached, a CPU set the container excludes).
///
/// Programming errors (starting a thread twice, joining a detached thread,
/// joining twice, a thread joining itself) are not errors of this type: they
/// stop the process with a message, because no caller can recover from them
/// meaningfully.
public enum NativeThreadError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The stack size is below the smallest one a `NativeThread` runs on
    /// (`Topology.minimumStackSize`: 32 KiB, or `sysconf(_SC_THREAD_STACK_MIN)`
    /// if that is larger).
    case stackSizeTooSmall(requested: Int, minimum: Int)
    /// The stack size is not a multiple of the page size (`Topology.pageSize`).
    /// glibc would round it up without saying so; Spindle refuses instead.
    case stackSizeNotPageMultiple(requested: Int, pageSize: Int)
    /// `pthread_create` refused a stack size that passed the checks above:
    /// too small to also hold the thread's descriptor, static thread-local
    /// storage and guard page (glibc carves them out of the stack).
    case stackSizeRejected(requested: Int)
    /// An affinity set names a CPU that is not online (`Topology.onlineCPUs`).
    case cpuOutOfRange(cpu: Int, online: [Int])
    /// An affinity set with no CPU in it: the thread could never run.
    case emptyCPUSet
    /// Every CPU of the set is online, but none is one this process may use
    /// (a cgroup cpuset or `taskset` excludes them); the kernel said EINVAL.
    case cpusNotAllowed(requested: [Int])
    /// A NUMA node that does not exist on this machine (`Topology.numaNodes`).
    case numaNodeOutOfRange(node: Int, available: [Int])
    /// Both an affinity set and a NUMA node were given, and the set holds CPUs
    /// outside the node, so the two cannot both hold.
    case cpusOutsideNode(cpus: [Int], node: Int, nodeCPUs: [Int])
    /// A thread name longer than Linux keeps (15 bytes of UTF-8; the kernel's
    /// 16-byte `comm` field holds the terminating NUL too).
    case nameTooLong(bytes: Int, limit: Int)
    /// A thread name with a NUL byte in it, which would cut it short.
    case nameContainsNUL
    /// A relative priority outside 0.0...1.0 (or not a number).
    case priorityOutOfRange(Double)
    /// A real-time priority outside the policy's range (1...99 on Linux).
    case realtimePriorityOutOfRange(requested: Int, allowed: ClosedRange<Int>)
    /// The kernel refused for lack of privilege: a real-time policy, or a nice
    /// value below the thread's current one, needs `CAP_SYS_NICE` or a
    /// suitable `RLIMIT_RTPRIO` / `RLIMIT_NICE`; a NUMA memory policy can be
    /// forbidden by a seccomp profile. `operation` says what was asked.
    case permissionDenied(operation: String, code: Int32)
    /// The thread has exited, so there is nothing left to configure.
    case threadExited(id: Int32)
    /// Any other refusal by the environment: the process's or the system's
    /// thread limit (`EAGAIN`), memory for the stack (`ENOMEM`), and so on.
    case systemCall(SystemCallError)

    /// What was wrong, with the value at fault and the limit it broke.
    public var description: String {
        switch self {
        case let .stackSizeTooSmall(requested, minimum):
            return "stack size \(requested) bytes is below the minimum of \(minimum) bytes (Topology.minimumStackSize: what Spindle's thread entry and exit need, or sysconf(_SC_THREAD_STACK_MIN) if larger)"
        case let .stackSizeNotPageMultiple(requested, pageSize):
            return "stack size \(requested) bytes is not a multiple of the \(pageSize)-byte page size"
        case let .stackSizeRejected(requested):
            return "pthread_create rejected a stack of \(requested) bytes: too small for the thread's descriptor, static TLS and guard page; ask for more"
        case let .cpuOutOfRange(cpu, online):
            return "CPU \(cpu) is not online; online CPUs: \(CPUList.format(online))"
        case .emptyCPUSet:
            return "the CPU affinity set is empty: the thread could never run"
        case let .cpusNotAllowed(requested):
            return "none of CPUs \(CPUList.format(requested)) is available to this process (cgroup cpuset or affinity mask)"
        case let .numaNodeOutOfRange(node, available):
            return "NUMA node \(node) does not exist; nodes: \(CPUList.format(available))"
        case let .cpusOutsideNode(cpus, node, nodeCPUs):
            return "CPUs \(CPUList.format(cpus)) are not all on NUMA node \(node), whose CPUs are \(CPUList.format(nodeCPUs))"
        case let .nameTooLong(bytes, limit):
            return "thread name is \(bytes) bytes of UTF-8; Linux keeps at most \(limit)"
        case .nameContainsNUL:
            return "thread name contains a NUL byte"
        case let .priorityOutOfRange(value):
            return "relative priority \(value) is outside 0.0...1.0"
        case let .realtimePriorityOutOfRange(requested, allowed):
            return "real-time priority \(requested) is outside \(allowed.lowerBound)...\(allowed.upperBound)"
        case let .permissionDenied(operation, code):
            return "permission denied: \(operation): \(errnoDescription(code)); needs CAP_SYS_NICE or a higher RLIMIT_RTPRIO/RLIMIT_NICE"
        case let .threadExited(id):
            return "thread \(id) has exited"
        case let .systemCall(error):
            return error.description
        }
    }
}

/// Lists of CPU or node ids in the kernel's compact form ("0-3,8,10-11"),
/// both ways.
enum CPUList {
    /// Parses "0-3,8" into [0, 1, 2, 3, 8]; nil if the text is malformed.
    static func parse(_ text: Substring) -> [Int]? {
        var ids: [Int] = []
        let trimmed = text.trimmingWhitespace
        if trimmed.isEmpty { return [] }
        for part in trimmed.split(separator: ",") {
            let bounds = part.split(separator: "-", omittingEmptySubsequences: false)
            switch bounds.count {
            case 1:
                guard let id = Int(bounds[0]), id >= 0 else { return nil }
                ids.append(id)
            case 2:
                guard let low = Int(bounds[0]), let high = Int(bounds[1]), low >= 0, low <= high else { return nil }
                ids.append(contentsOf: low...high)
            default:
                return nil
            }
        }
        return Array(Set(ids)).sorted()
    }

    /// Formats sorted or unsorted ids as "0-3,8"; "none" when empty.
    static func format(_ ids: [Int]) -> String {
        let sorted = Array(Set(ids)).sorted()
        guard var start = sorted.first else { return "none" }
        var parts: [String] = []
        var previous = start
        for id in sorted.dropFirst() {
            if id == previous + 1 { previous = id; continue }
            parts.append(start == previous ? "\(start)" : "\(start)-\(previous)")
            start = id
            previous = id
        }
        parts.append(start == previous ? "\(start)" : "\(start)-\(previous)")
        return parts.joined(separator: ",")
    }
}

extension Substring {
    var trimmingWhitespace: Substring {
        var s = self
        while let c = s.first, c.isWhitespace { s.removeFirst() }
        while let c = s.last, c.isWhitespace { s.removeLast() }
        return s
    }
}
