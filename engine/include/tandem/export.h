// What libtandem.so exports. The library is built with hidden visibility
// (cmake/TandemInstall.cmake): only the declarations of the public headers, marked TANDEM_API,
// are in its dynamic symbol table. The rest (backends, the parameter server, the transport, the
// kernels, the libraries it links statically) stays internal: a program cannot come to depend
// on it, and it does not clash with the same names elsewhere in the process (another ZeroMQ,
// JSON or CUDA runtime build).
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define TANDEM_API __attribute__((visibility("default")))
#else
#define TANDEM_API
#endif
