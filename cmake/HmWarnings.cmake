# Warnings for hetmem's own targets: hm_set_warnings(target)
function(hm_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wno-unused-parameter
    $<$<COMPILE_LANGUAGE:C>:-Wstrict-prototypes -Wmissing-prototypes>)
  if(HM_DEVELOPER)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
