# SPDX-License-Identifier: MIT
# Install rules: public headers, libhetmem.so + libhetmem.a, the CMake package
# (hetmemConfig.cmake, version file, exported targets hetmem::hetmem and
# hetmem::hetmem_static) and hetmem.pc. Internals (src/) are never installed.
# Included at the end of the top-level CMakeLists.txt.

include(CMakePackageConfigHelpers)

set(HM_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/hetmem"
    CACHE STRING "Where hetmemConfig.cmake is installed (relative to the prefix)")

# Headers: the public API only.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/hetmem
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT hetmem_development
        FILES_MATCHING PATTERN "*.h")

# Two export sets: the shared library has no link-time dependencies for its
# users, the static one needs hwloc, liburcu-bp/cds and Threads, which the
# config file finds only when the static targets are loaded.
install(TARGETS hetmem EXPORT hetmemTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT hetmem_runtime
                NAMELINK_COMPONENT hetmem_development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT hetmem_runtime
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS hetmem_static EXPORT hetmemStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT hetmem_development
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(EXPORT hetmemTargets NAMESPACE hetmem:: DESTINATION ${HM_INSTALL_CMAKEDIR}
        FILE hetmemTargets.cmake COMPONENT hetmem_development)
install(EXPORT hetmemStaticTargets NAMESPACE hetmem:: DESTINATION ${HM_INSTALL_CMAKEDIR}
        FILE hetmemStaticTargets.cmake COMPONENT hetmem_development)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/hetmemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/hetmemConfig.cmake
  INSTALL_DESTINATION ${HM_INSTALL_CMAKEDIR})
# 0.x: minor versions may break the API, so only the same minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/hetmemConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/hetmemConfig.cmake
              ${PROJECT_BINARY_DIR}/hetmemConfigVersion.cmake
        DESTINATION ${HM_INSTALL_CMAKEDIR} COMPONENT hetmem_development)

# hetmem.pc, relocatable: the prefix is found from the .pc file's own place,
# so `cmake --install build --prefix DIR` gives a working file under DIR.
set(_hm_pcdir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(IS_ABSOLUTE "${_hm_pcdir}")
  set(HM_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _hm_up "/hm_root/${_hm_pcdir}" "/hm_root")
  string(REGEX REPLACE "/$" "" _hm_up "${_hm_up}")
  set(HM_PC_PREFIX "\${pcfiledir}/${_hm_up}")
endif()
foreach(_hm_dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_hm_dir}}")
    set(HM_PC_${_hm_dir} "${CMAKE_INSTALL_${_hm_dir}}")
  else()
    set(HM_PC_${_hm_dir} "\${prefix}/${CMAKE_INSTALL_${_hm_dir}}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/hetmem.pc.in ${PROJECT_BINARY_DIR}/hetmem.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/hetmem.pc DESTINATION ${_hm_pcdir}
        COMPONENT hetmem_development)
