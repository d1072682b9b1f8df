# The installable library: one shared libtandem holding every layer whole (engine, kernels,
# transport, the parameter server, the cluster and its dashboard), its public headers, a CMake
# package (find_package(Tandem) -> Tandem::tandem) and a pkg-config file.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# libtandem.so is built from the layer libraries' object files, so it holds them whole. Their
# own dependencies are linked privately: no public header includes ZeroMQ, cpp-httplib, NCCL or
# nlohmann::json, so a consumer needs none of them to build, only the shared libraries at run
# time (found where they were linked: INSTALL_RPATH_USE_LINK_PATH).
set(TANDEM_LAYERS tandem_engine tandem_kernels tandem_transport tandem_transport_zmq tandem_ps
                  tandem_cluster tandem_dashboard)
add_library(tandem SHARED)
foreach(layer IN LISTS TANDEM_LAYERS)
  target_sources(tandem PRIVATE $<TARGET_OBJECTS:${layer}>)
  # Only what the public headers mark TANDEM_API (tandem/export.h) is exported; the layers'
  # internals are hidden (they were all exported, some 1,900 symbols, for a program to come to
  # depend on). The tests and the CLI link the layers statically and see everything as before.
  set_target_properties(${layer} PROPERTIES CXX_VISIBILITY_PRESET hidden
                        CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
endforeach()
# Nor does it re-export the static libraries it links (the CUDA runtime), nor the vector clones
# GCC exports whatever the visibility (libtandem.map).
target_link_options(tandem PRIVATE "LINKER:--exclude-libs,ALL"
                    "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/libtandem.map")
set_property(TARGET tandem APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/libtandem.map)
add_library(Tandem::tandem ALIAS tandem)
target_link_libraries(tandem PRIVATE BLAS::BLAS ZLIB::ZLIB PNG::PNG PkgConfig::ZSTD PkgConfig::BLOSC
                      PkgConfig::ZMQ PkgConfig::HTTPLIB
                      Threads::Threads nlohmann_json::nlohmann_json
                      $<$<BOOL:${TANDEM_WITH_CUDA}>:CUDA::cudart_static> ${CMAKE_DL_LIBS})
# The worker group's NCCL collective, where engine/CMakeLists.txt found NCCL for tandem_cluster.
if(TANDEM_WITH_NCCL)
  target_link_libraries(tandem PRIVATE ${TANDEM_NCCL_LIBRARY})
endif()
target_include_directories(tandem INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/engine/include>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/engine/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(tandem INTERFACE cxx_std_17)
set_target_properties(tandem PROPERTIES
  # Below 1.0 every minor release may break the ABI: the soname carries it (libtandem.so.0.1).
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  EXPORT_NAME tandem
  # The installed library and binary find NCCL where they were linked against it. (cuBLASLt is
  # loaded when first used, by name, then from the toolkit's directory: cublaslt_api.h.)
  INSTALL_RPATH_USE_LINK_PATH ON)

install(TARGETS tandem EXPORT TandemTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/engine/include/tandem
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/engine/include/tandem/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tandem)

set(TANDEM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Tandem)
install(EXPORT TandemTargets NAMESPACE Tandem:: DESTINATION ${TANDEM_CMAKE_DIR})
configure_package_config_file(cmake/TandemConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/TandemConfig.cmake INSTALL_DESTINATION ${TANDEM_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/TandemConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/TandemConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/TandemConfigVersion.cmake
  DESTINATION ${TANDEM_CMAKE_DIR})

# pkg-config: paths relative to the .pc file, so an install under any --prefix works; absolute
# ones where the library or include directory was given absolute (a distribution's
# -DCMAKE_INSTALL_LIBDIR=/usr/lib64), which no --prefix moves.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(TANDEM_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(TANDEM_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(TANDEM_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH TANDEM_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
  set(TANDEM_PC_PREFIX "\${pcfiledir}/${TANDEM_PC_TO_PREFIX}")
  set(TANDEM_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(TANDEM_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(cmake/tandem.pc.in ${CMAKE_CURRENT_BINARY_DIR}/tandem.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tandem.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(TARGET tandem_cli)
  set_target_properties(tandem_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS tandem_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
