# Sourced by the bench scripts.
# field JSON EXPR: EXPR evaluated in Python with j = the parsed JSON (e.g. "j['test']['accuracy']").
field() { python3 -c "import json,sys; j=json.loads(sys.argv[1]); print(eval(sys.argv[2]))" "$1" "$2"; }
