// A layer of your own whose forward returns a copy of its output instead of a reference to
// its own buffer, which the next layer keeps the address of.
#define USER_LAYER_FORWARD_BY_VALUE
#include "user_layer.hpp"

int main() { user::build_model(); }
