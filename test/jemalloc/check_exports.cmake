# SPDX-License-Identifier: MIT
# ctest: fail if libhetmem.so exports an allocator entry point or any jemalloc
# symbol (dynamic symbol table, defined symbols only).
execute_process(COMMAND ${NM} -D --defined-only ${LIB} OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm -D ${LIB} failed: ${rc}")
endif()
string(REPLACE "\n" ";" lines "${syms}")
set(bad "")
foreach(l ${lines})
  if(l MATCHES " ([^ ]+)$")
    set(s "${CMAKE_MATCH_1}")
    if(s MATCHES "^(malloc|free|calloc|realloc|posix_memalign|aligned_alloc|memalign|valloc|pvalloc|malloc_usable_size|mallocx|dallocx|sdallocx|rallocx|xallocx|sallocx|nallocx|mallctl.*|malloc_conf|malloc_message|malloc_stats_print|__libc_.*|_Zn[wa].*|_Zd[la].*)$"
       OR s MATCHES "^(hm_je_|hm_jei_|je_|_rjem_|jemalloc_)")
      list(APPEND bad "${s}")
    endif()
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "libhetmem.so exports: ${bad}")
endif()
list(LENGTH lines n)
message(STATUS "libhetmem.so: ${n} dynamic symbols, none of an allocator or of jemalloc")
