// TEMPORARY placeholder: the fast CPU backend replaces this file.
#include "core/backend.hpp"
namespace shortconv::cpu {
size_t workspace_bytes(const Problem& p) { return ref::workspace_bytes(p); }
sc_status run(const Problem& p, sc_error* err) { return ref::run(p, err); }
}  // namespace shortconv::cpu
