// stb's headers (libstb-dev), with their own warnings silenced: they are third-party C.
#pragma once
#pragma GCC system_header

#include <stb_easy_font.h>
#include <stb_image.h>
#include <stb_image_write.h>
