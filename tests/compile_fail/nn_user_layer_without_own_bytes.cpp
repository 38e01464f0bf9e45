// A layer of your own without own_bytes (and so no part in activation_bytes()).
#define USER_LAYER_NO_OWN_BYTES
#include "user_layer.hpp"

int main() { user::build_model(); }
