"""The one way moeplan touches a user's files: bounded reads (`reading`, `json_input`) and atomic
writes (`writing`). Nothing here imports the rest of moeplan, so every room can use it."""
